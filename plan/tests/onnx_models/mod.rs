//! Where the model-zoo ONNX graphs are, for the tests and benches that read them.

use std::path::PathBuf;
use std::process::Command;

/// The directory with the `.onnx` files: `$USERDMA_ONNX_MODELS`, or what the script prints.
pub(crate) fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("USERDMA_ONNX_MODELS") {
        return dir.into();
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/onnx-models.sh");
    let out = Command::new("sh").arg(script).output().unwrap_or_else(|e| {
        panic!("USERDMA_ONNX_MODELS is unset and running {script} failed ({e}); run it and export USERDMA_ONNX_MODELS=\"$(scripts/onnx-models.sh | tail -n 1)\"")
    });
    assert!(
        out.status.success(),
        "USERDMA_ONNX_MODELS is unset and {script} failed:\n{}\nfix that, then export USERDMA_ONNX_MODELS=\"$(scripts/onnx-models.sh | tail -n 1)\"",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("script output is UTF-8");
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("the script prints the directory last"),
    )
}
