//! Compiles `c/dpdk.c` against Debian's `libdpdk-dev` (DPDK 22.11), found through pkg-config,
//! and links the three DPDK libraries it calls. Only userdma's benchmarks depend on this crate.

use std::process::Command;

/// The DPDK libraries `c/dpdk.c` calls (their own dependencies come with them).
const LIBS: [&str; 3] = ["rte_ring", "rte_mempool", "rte_eal"];

fn pkg_config(arg: &str) -> Vec<String> {
    let output = Command::new("pkg-config")
        .args([arg, "libdpdk"])
        .output()
        .unwrap_or_else(|error| {
            panic!("pkg-config: {error}; install pkg-config and libdpdk-dev (scripts/test.sh does)")
        });
    if !output.status.success() {
        panic!(
            "pkg-config {arg} libdpdk failed ({}): install libdpdk-dev (scripts/test.sh does)\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=c/dpdk.c");
    println!("cargo:rerun-if-changed=c/dpdk.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let version = pkg_config("--modversion").join("");
    if !version.starts_with("22.11") {
        println!("cargo:warning=DPDK {version} found; the baseline is written for 22.11");
    }
    let mut build = cc::Build::new();
    build
        .file("c/dpdk.c")
        .opt_level(3)
        .warnings(true)
        .extra_warnings(true)
        .flag("-std=gnu11");
    let cflags = pkg_config("--cflags");
    let mut flags = cflags.iter();
    while let Some(flag) = flags.next() {
        if let Some(dir) = flag.strip_prefix("-I") {
            build.include(dir);
        } else if flag == "-include" {
            // `-include rte_config.h`: a pair of arguments.
            let file = flags.next().expect("-include takes a file");
            build.flag("-include").flag(file);
        } else {
            build.flag(flag);
        }
    }
    build.compile("userdma_bench_dpdk");
    let libs = pkg_config("--libs");
    for flag in &libs {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        }
    }
    for lib in LIBS {
        assert!(
            libs.iter().any(|flag| flag.strip_prefix("-l") == Some(lib)),
            "pkg-config --libs libdpdk does not name {lib}"
        );
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    println!("cargo:version={version}");
}
