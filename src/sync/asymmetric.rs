//! Asymmetric fences: a store-load barrier whose cost is paid by the rare side only.
//!
//! Dekker's pattern (each of two threads stores its flag, then loads the other's) needs a full
//! fence between the store and the load on *both* sides, or each may load the other's old
//! value. When one side runs millions of times a second (a pool's thread-cache fast path) and
//! the other almost never (a thread reclaiming blocks from other threads' caches), the frequent
//! side can use a compiler barrier only ([`light`]) and the rare side a barrier that makes every
//! other thread of the process execute a full fence ([`heavy`]): the kernel's `membarrier`,
//! which interrupts each CPU running one of our threads (a thread that is not running passes a
//! full barrier when it is switched back in). Then for every light-side store and load, either
//! both happen before the heavy barrier's effect on that thread, or both after; the usual
//! argument that one of the two threads sees the other's store goes through. This is Folly's
//! `asymmetricLightBarrier` / `asymmetricHeavyBarrier` and liburcu's "memb" flavour.
//!
//! [`heavy`] uses, in this order of preference, what the kernel offers: the private expedited
//! command (Linux 4.14, an IPI to the CPUs running this process; the process registers once),
//! the global command (Linux 4.3; it waits for an RCU grace period, milliseconds), and where
//! neither is allowed (a seccomp filter) a page whose protection is changed, which makes the
//! kernel flush the TLBs of every CPU running the process by IPI (what .NET does where it has
//! no `membarrier`).
//!
//! Under loom (and Miri) both sides are `fence(SeqCst)`: the models check the algorithm with
//! symmetric fences, a stronger guarantee than the asymmetric pair gives the hardware.

#[cfg(not(any(loom, miri)))]
use std::sync::OnceLock;

use super::Ordering;

/// The frequent side: orders this thread's earlier stores before its later loads against a
/// thread that runs [`heavy`]. A compiler barrier only (no instruction).
///
/// On x86-64 and AArch64 it is an empty `asm!` block, which the compiler must assume reads and
/// writes any memory (as Linux's `barrier()`), so no access moves across it; the equivalent
/// `compiler_fence(SeqCst)` made LLVM stop inlining the pool's free path into a `Buffer`'s
/// drop (a call per free, measured 0.5 ns on a 2.3 ns get + put).
#[inline(always)]
pub(crate) fn light() {
    #[cfg(any(loom, miri))]
    super::fence(Ordering::SeqCst);
    #[cfg(all(
        not(any(loom, miri)),
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    // SAFETY: an empty instruction sequence: it touches no register, flag, stack or memory.
    // Without `nomem` the compiler treats it as reading and writing memory, which is the point.
    unsafe {
        std::arch::asm!("", options(nostack, preserves_flags))
    };
    #[cfg(all(
        not(any(loom, miri)),
        not(any(target_arch = "x86_64", target_arch = "aarch64"))
    ))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

/// The rare side: a full fence here and, before it returns, on every other thread of the
/// process (see the module docs). Microseconds with the expedited `membarrier`; the fallbacks
/// are slower. Never fails: the last fallback needs only `mprotect`.
pub(crate) fn heavy() {
    #[cfg(any(loom, miri))]
    super::fence(Ordering::SeqCst);
    #[cfg(not(any(loom, miri)))]
    {
        std::sync::atomic::fence(Ordering::SeqCst);
        method().run();
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// How [`heavy`] reaches the other threads here: decided once per process.
#[cfg(not(any(loom, miri)))]
#[derive(Debug)]
pub(crate) enum Method {
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, registered.
    PrivateExpedited,
    /// `MEMBARRIER_CMD_GLOBAL`.
    Global,
    /// A page's protection flipped under a lock (TLB shootdown IPIs).
    Protection(shim::FlushPage),
}

#[cfg(not(any(loom, miri)))]
fn method() -> &'static Method {
    static METHOD: OnceLock<Method> = OnceLock::new();
    METHOD.get_or_init(Method::detect)
}

#[cfg(not(any(loom, miri)))]
impl Method {
    /// The best method the kernel allows this process.
    fn detect() -> Method {
        use userdma_sys::membarrier::{
            MEMBARRIER_CMD_GLOBAL, MEMBARRIER_CMD_PRIVATE_EXPEDITED, MEMBARRIER_CMD_QUERY,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
        };
        let supported = shim::membarrier(MEMBARRIER_CMD_QUERY).unwrap_or(0);
        let expedited =
            MEMBARRIER_CMD_PRIVATE_EXPEDITED | MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED;
        if supported & expedited == expedited
            && shim::membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED).is_ok()
        {
            return Method::PrivateExpedited;
        }
        if supported & MEMBARRIER_CMD_GLOBAL != 0 {
            return Method::Global;
        }
        Method::protection()
    }

    /// The page-protection method (also what tests force to check it).
    pub(crate) fn protection() -> Method {
        Method::Protection(shim::FlushPage::new())
    }

    /// Runs the barrier.
    pub(crate) fn run(&self) {
        use userdma_sys::membarrier::{MEMBARRIER_CMD_GLOBAL, MEMBARRIER_CMD_PRIVATE_EXPEDITED};
        let done = match self {
            Method::PrivateExpedited => shim::membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED).is_ok(),
            Method::Global => shim::membarrier(MEMBARRIER_CMD_GLOBAL).is_ok(),
            Method::Protection(page) => page.flush(),
        };
        if !done {
            // The command worked when it was chosen; a kernel that refuses it now (a seccomp
            // filter installed since) still lets the page method through.
            fallback().flush();
        }
    }
}

/// The page method, for a process whose `membarrier` stopped working after it was chosen.
#[cfg(not(any(loom, miri)))]
fn fallback() -> &'static shim::FlushPage {
    static PAGE: OnceLock<shim::FlushPage> = OnceLock::new();
    PAGE.get_or_init(shim::FlushPage::new)
}

#[cfg(not(any(loom, miri)))]
mod shim {
    //! The raw calls: `membarrier(2)` and the page whose protection changes.

    use std::io;
    use std::sync::Mutex;

    use libc::c_int;

    /// `membarrier(cmd, 0, 0)`: its non-negative result, or the errno.
    pub(super) fn membarrier(cmd: c_int) -> io::Result<c_int> {
        // SAFETY: `membarrier` takes three integers and touches no memory of ours; an unknown
        // command or an unregistered process is an error return, not undefined behaviour.
        let ret = unsafe {
            libc::syscall(
                userdma_sys::membarrier::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as c_int,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        // The kernel returns an int.
        Ok(c_int::try_from(ret).unwrap_or(c_int::MAX))
    }

    /// One page of our own whose protection [`FlushPage::flush`] takes away after writing it,
    /// under a lock: removing write access to a dirty page makes the kernel flush the TLB of
    /// every CPU that may cache the mapping (every CPU running a thread of this process), by
    /// IPI, and each interrupted CPU executes a full barrier.
    #[derive(Debug)]
    pub(crate) struct FlushPage {
        /// The page, or `None` if it could not be mapped (then `flush` reports failure).
        page: Option<memmap2::MmapRaw>,
        lock: Mutex<()>,
    }

    impl FlushPage {
        pub(super) fn new() -> FlushPage {
            let page = memmap2::MmapOptions::new()
                .len(4096)
                .map_anon()
                .ok()
                .map(memmap2::MmapRaw::from);
            FlushPage {
                page,
                lock: Mutex::new(()),
            }
        }

        /// Runs the barrier; `false` if the page is missing or `mprotect` failed.
        pub(super) fn flush(&self) -> bool {
            let Some(page) = &self.page else {
                return false;
            };
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let ptr = page.as_mut_ptr().cast::<libc::c_void>();
            let len = page.len();
            // SAFETY: `ptr..ptr + len` is our own anonymous mapping, which nothing else refers
            // to; it is made writable before the write and read-only after, under the lock.
            unsafe {
                if libc::mprotect(ptr, len, libc::PROT_READ | libc::PROT_WRITE) != 0 {
                    return false;
                }
                // Dirty the page so its TLB entries are live on this CPU and the downgrade
                // below must be shot down everywhere.
                std::ptr::write_volatile(ptr.cast::<u8>(), 1);
                libc::mprotect(ptr, len, libc::PROT_READ) == 0
            }
        }
    }
}

#[cfg(all(test, not(any(loom, miri))))]
mod tests {
    use std::sync::atomic::{AtomicU32, AtomicUsize};
    use std::sync::Arc;

    use super::*;

    /// The store-buffering litmus test: thread A stores `x` then loads `y` with only [`light`]
    /// between; thread B stores `y`, runs `barrier`, loads `x`. Both loads seeing 0 is what a
    /// missing store-load barrier allows (x86 shows it within a few thousand rounds with a
    /// compiler barrier on both sides: see `without_a_heavy_side_the_cpu_reorders`); the pair
    /// must never allow it. Each round has fresh words and starts when both threads arrive.
    /// Returns how many rounds saw 0 on both sides.
    fn store_buffering(rounds: usize, barrier: impl Fn() + Send + 'static) -> usize {
        let words: Arc<Vec<[AtomicU32; 2]>> = Arc::new(
            (0..rounds)
                .map(|_| [AtomicU32::new(0), AtomicU32::new(0)])
                .collect(),
        );
        let arrived = Arc::new(AtomicUsize::new(0));
        let side = |me: usize, barrier: Box<dyn Fn() + Send>| {
            let (words, arrived) = (Arc::clone(&words), Arc::clone(&arrived));
            std::thread::spawn(move || {
                let mut seen = Vec::with_capacity(rounds);
                for (round, pair) in words.iter().enumerate() {
                    // Both threads arrive before either stores: 2 * round + 2 arrivals.
                    arrived.fetch_add(1, Ordering::AcqRel);
                    while arrived.load(Ordering::Acquire) < 2 * round + 2 {
                        std::hint::spin_loop();
                    }
                    pair[me].store(1, Ordering::Relaxed);
                    barrier();
                    seen.push(pair[1 - me].load(Ordering::Relaxed));
                }
                seen
            })
        };
        let a = side(0, Box::new(light));
        let b = side(1, Box::new(barrier));
        let (a, b) = (a.join().expect("side A"), b.join().expect("side B"));
        a.iter()
            .zip(&b)
            .filter(|(ra, rb)| **ra == 0 && **rb == 0)
            .count()
    }

    /// The test above can fail: with a compiler barrier on both sides, this CPU lets both
    /// loads pass their stores (reported, not asserted: how often depends on the machine).
    #[test]
    fn without_a_heavy_side_the_cpu_reorders() {
        let both_zero = store_buffering(200_000, light);
        eprintln!("light on both sides: {both_zero} of 200000 rounds saw 0 on both sides");
    }

    #[test]
    fn the_heavy_barrier_orders_the_light_side() {
        let chosen = method();
        assert_eq!(store_buffering(20_000, heavy), 0, "with {chosen:?}");
        let page = Method::protection();
        assert_eq!(
            store_buffering(2_000, move || page.run()),
            0,
            "with the page method"
        );
        if matches!(chosen, Method::PrivateExpedited) {
            // The global command waits for a grace period: a few rounds.
            assert_eq!(store_buffering(20, || Method::Global.run()), 0, "global");
        }
    }

    #[test]
    fn the_page_method_works_here() {
        match Method::protection() {
            Method::Protection(page) => assert!(page.flush(), "mprotect of our own page"),
            other => panic!("{other:?}"),
        }
    }
}
