//! Pieces userdma's benchmarks share, and the baseline they are held against.
//!
//! - [`dpdk`]: DPDK 22.11 (`rte_mempool`, `rte_ring`) run through the same loops as the
//!   benchmarks' own cases, from a small C part compiled against Debian's `libdpdk-dev`.
//! - [`cpu`]: pinning to the host CPU (0) and the device CPU (1), and the cache-line ping-pong
//!   between them that every two-thread figure is printed with.
//!
//! A crate of its own because Cargo has no bench-only dependencies: userdma takes it as a
//! dev-dependency, so the library never links DPDK, and the build script that compiles the C
//! part belongs to this crate alone.

pub mod cpu;
pub mod dpdk;

/// Whether a benchmark binary should print its ratio table: with no benchmark filter, or with
/// the filter `ratios-only` (which no criterion benchmark matches, so only the table runs).
/// Criterion's options that take a value are skipped with their value.
pub fn wants_ratios() -> bool {
    const VALUED: [&str; 14] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--save-baseline",
        "--baseline",
        "--load-baseline",
        "--output-format",
        "--plotting-backend",
        "--profile-time",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--nresamples",
        "--color",
    ];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if VALUED.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') {
            return arg == "ratios-only";
        }
    }
    true
}
