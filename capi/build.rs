//! Gives the shared library its versioned SONAME, `libuserdma.so.<major>`, so a program linked
//! against one major version is never loaded with another.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libuserdma.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
}
