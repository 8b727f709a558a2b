//! The README's first-transfer program is `examples/first_transfer.rs` (which `cargo test`
//! builds), word for word, and it runs.

use std::process::Command;

#[test]
fn readme_first_transfer_is_the_example_and_it_runs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let start = readme
        .find("```rust\n")
        .expect("a rust block in the README")
        + "```rust\n".len();
    let end = start + readme[start..].find("```").expect("the block's end");
    let example = std::fs::read_to_string(format!("{root}/examples/first_transfer.rs"))
        .expect("examples/first_transfer.rs");
    let code: String = example
        .lines()
        .skip_while(|line| line.starts_with("//!") || line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(
        readme[start..end],
        code,
        "the README's first transfer differs from examples/first_transfer.rs: make them the same"
    );
    let status = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--example", "first_transfer"])
        .current_dir(root)
        .status()
        .expect("cargo run --example first_transfer");
    assert!(status.success(), "the example failed: {status}");
}
