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

/// Where a timed loop's code starts within a 64-byte line, in bytes: the code placements every
/// single-thread loop of the ratio tables is timed at, ours ([`place`]) and DPDK's (the C side
/// pads the same way).
///
/// The ratio tables time each single-thread loop in every *layout*: each code placement
/// crossed with each of the [`STACK_OFFSETS`]. On this kind of machine, moving a loop's code
/// by 16 bytes changed its time by up to 1.5×, and moving its stack frame (which the kernel
/// places at random for each process) by up to 4×, for DPDK's loop and for ours alike (a
/// loop's stores to buffers and its loads from its own stack falsely conflict when their
/// addresses agree in the low 12 bits). A figure taken in whatever layout a process happened
/// to get measures the layout as much as the loop, and a change anywhere in the binary could
/// move a ratio; the tables keep each side's fastest layout and print the spread over the
/// others.
pub const PLACEMENTS: [usize; 4] = [0, 16, 32, 48];

/// How far below its caller's frame a timed loop's stack frame is moved, in bytes ([`on_stack`]):
/// spread over a 4 KiB page, 1 KiB + 16 bytes apart (so each also sits at another 16-byte step
/// of a 64-byte line), so that a false conflict one of them meets is unlikely to repeat in all.
pub const STACK_OFFSETS: [usize; 4] = [0, 1040, 2080, 3120];

// `on_stack` has one arm per stack offset, and the C side (`udb_mempool_get_put`) one copy of
// its loop per placement.
const _: () = assert!(STACK_OFFSETS.len() == 4 && PLACEMENTS.len() == 4);

/// Runs `f` with its stack frame [`STACK_OFFSETS`]`[index]` bytes lower than it would be.
/// Panics if `index` is out of range.
pub fn on_stack<R>(index: usize, f: &mut dyn FnMut() -> R) -> R {
    /// `f` below a frame that holds `P` more bytes.
    #[inline(never)]
    fn below<const P: usize, R>(f: &mut dyn FnMut() -> R) -> R {
        let pad = [0u8; P];
        // Kept in memory (the reference escapes), so the frame really holds it.
        std::hint::black_box(&pad);
        let result = f();
        std::hint::black_box(&pad);
        result
    }
    match index {
        0 => below::<{ STACK_OFFSETS[0] }, R>(f),
        1 => below::<{ STACK_OFFSETS[1] }, R>(f),
        2 => below::<{ STACK_OFFSETS[2] }, R>(f),
        3 => below::<{ STACK_OFFSETS[3] }, R>(f),
        _ => panic!("stack offset {index} outside 0..{}", STACK_OFFSETS.len()),
    }
}

/// Moves the code that follows `AT` bytes past a 64-byte boundary: nops up to the next
/// boundary (which also makes the function's section 64-byte aligned), then `AT` more. Call
/// it first in an `#[inline(never)]` function that holds the timed loop; the nops run once per
/// call. Elsewhere than on x86-64 it does nothing (the placement is the linker's).
#[inline(always)]
pub fn place<const AT: usize>() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the block only emits nop instructions (0x90): it reads and writes no register,
    // no memory, no stack and no flag.
    unsafe {
        std::arch::asm!(
            ".balign 64, 0x90",
            ".skip {at}, 0x90",
            at = const AT,
            options(nomem, nostack, preserves_flags)
        );
    }
}

/// What [`frame_pad`] returns: 24 bytes held in the calling function's frame until it ends.
#[derive(Debug)]
pub struct FramePad([u64; 3]);

impl Drop for FramePad {
    #[inline(always)]
    fn drop(&mut self) {
        // Read at the end, so the bytes stay in the frame for the whole function.
        std::hint::black_box(&self.0);
    }
}

/// For the placements `AT` of 16 and 48 bytes, 24 bytes more in the calling function's frame,
/// held until it returns (`let _pad = frame_pad::<AT>();` first in a timed loop's function);
/// nothing for 0 and 32. A function's locals sit where its compiler put them in its frame,
/// which `on_stack` moves only by whole 16-byte steps (the ABI keeps the stack pointer
/// 16-byte aligned): where a loop's array of 32 block indices or pointers lands, 0 or 8 bytes
/// into a 16-byte step, changed how fast its 16-byte stores forward to the 4-byte loads that
/// read it back (a batch made each round: 0.52 against 0.73 ns a buffer on this machine, the
/// same code). So half the placements move the locals by 8 bytes, on both sides (the C loops
/// do the same), and the table keeps each side's fastest layout.
#[inline(always)]
pub fn frame_pad<const AT: usize>() -> Option<FramePad> {
    if (AT / 16) % 2 == 1 {
        let pad = FramePad([0; 3]);
        std::hint::black_box(&pad.0);
        Some(pad)
    } else {
        None
    }
}

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
