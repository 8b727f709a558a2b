//! In steady state the pool makes no system call and no heap allocation, on one thread and
//! across threads.
//!
//! Three witnesses: a counting `#[global_allocator]` (per thread), a seccomp filter that makes
//! every system call of the measuring threads trap into a counting `SIGSYS` handler instead of
//! running (x86-64 and aarch64 Linux), and the pool's own counters (for the single-thread case:
//! every allocation a thread-cache hit, nothing taken from the shared lists or the buddy
//! allocator). Each window is preceded by a warm-up that claims the thread's cache slot, carves
//! the slabs and fills the caches; the rest of each test checks that the witnesses would have
//! seen a system call or an allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Once};

use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Buffer, Config, Pool};

// ---- witness 1: heap allocations, counted per thread ------------------------------------------

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: allocations during thread teardown, after the counter is gone, are not ours.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged; counting touches only a
// thread-local `Cell` with a const initializer (no allocation, no re-entrancy).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_one();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap operations (allocations, reallocations, frees) made by this thread so far.
fn heap_operations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// ---- witness 2: system calls, trapped by seccomp ------------------------------------------------

thread_local! {
    /// System calls this thread made while filtered. A const-initialized `Cell` with no
    /// destructor: reading it in a signal handler touches nothing but this thread's TLS block.
    static TRAPPED: Cell<u64> = const { Cell::new(0) };
}

/// System calls this thread has made while filtered.
fn traps() -> u64 {
    TRAPPED.with(Cell::get)
}

extern "C" fn on_sigsys(
    _signal: libc::c_int,
    _info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // The handler runs on the thread whose call trapped.
    let _ = TRAPPED.try_with(|n| n.set(n.get() + 1));
    // The trapped call did not run; make it fail with ENOSYS rather than return garbage.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the kernel passes a valid ucontext_t for SA_SIGINFO handlers; RAX holds the
    // return value the interrupted code will see.
    unsafe {
        let context = &mut *context.cast::<libc::ucontext_t>();
        context.uc_mcontext.gregs[libc::REG_RAX as usize] = -i64::from(libc::ENOSYS);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = context;
}

fn install_sigsys_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler is async-signal-safe
        // (one atomic add and a register write).
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigsys as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            let rc = libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut());
            assert_eq!(
                rc,
                0,
                "sigaction(SIGSYS): {}",
                std::io::Error::last_os_error()
            );
        }
    });
}

/// Whether the seccomp witness runs: not in a sanitized build (scripts/sanitize.sh), whose
/// runtime makes system calls of its own inside any window (shadow memory, its allocator) and
/// takes over SIGSYS. There the other two witnesses still run, and the sanitizer watches the
/// same steady-state paths.
const SYSCALL_WITNESS: bool = !cfg!(any(
    userdma_sanitize = "address",
    userdma_sanitize = "thread"
));

/// From now on, every system call of the calling thread traps
/// instead of running (counted in this thread's `TRAPPED`) — except returning from the signal
/// handler and exiting the thread.
fn forbid_system_calls() {
    if !SYSCALL_WITNESS {
        return;
    }
    install_sigsys_handler();
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump_if = |k: libc::c_long, to_allow: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt: to_allow,
        jf: 0,
        k: k as u32,
    };
    let mut program = [
        // The system call number: offset 0 of `struct seccomp_data`.
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jump_if(libc::SYS_rt_sigreturn, 3),
        jump_if(libc::SYS_exit, 2),
        jump_if(libc::SYS_exit_group, 1),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_TRAP),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: plain prctl/seccomp calls on this thread; `fprog` points to a valid program that
    // lives for the call (the kernel copies it).
    unsafe {
        let rc = libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        assert_eq!(
            rc,
            0,
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        );
        let rc = libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        );
        assert_eq!(
            rc,
            0,
            "seccomp filter (needs a kernel with CONFIG_SECCOMP_FILTER): {}",
            std::io::Error::last_os_error()
        );
    }
}

/// One system call, to prove a filter is in force: it must be trapped.
fn probe_system_call() {
    if !SYSCALL_WITNESS {
        return;
    }
    // SAFETY: getpid has no preconditions.
    let _ = unsafe { libc::syscall(libc::SYS_getpid) };
}

// ---- the pool under test ------------------------------------------------------------------------

fn pool() -> Arc<Pool> {
    let region = Region::builder(64 << 20)
        .page_size(PageSize::Base)
        .build()
        .expect("64 MiB of locked base pages (run as root or raise RLIMIT_MEMLOCK)");
    let mapping = SoftIommu::new(48).unwrap().map(Arc::new(region)).unwrap();
    Arc::new(Pool::new(mapping, Config::default()).unwrap())
}

const SIZES: [usize; 5] = [1, 256, 4096, 60_000, 1 << 20];

/// One round of the single-thread workload: every size alloc/write/read/free, 16 in flight,
/// a bulk batch of 32.
fn workload<'p>(pool: &'p Pool, held: &mut Vec<Buffer<'p>>, bulk: &mut Vec<Buffer<'p>>) {
    for &size in &SIZES {
        let buffer = pool.alloc(size).expect("steady-state allocation");
        buffer.write(0, &[0xa5]).unwrap();
        let mut byte = [0u8];
        buffer.read(0, &mut byte).unwrap();
        assert_eq!(byte[0], 0xa5);
        drop(buffer);
    }
    for _ in 0..16 {
        held.push(pool.alloc(4096).expect("in-flight allocation"));
    }
    held.clear();
    pool.alloc_bulk(2048, 32, bulk).expect("bulk allocation");
    pool.free_bulk(bulk.drain(..));
}

#[test]
fn one_thread_steady_state_makes_no_system_call_and_no_heap_allocation() {
    let pool = pool();
    let before = pool.stats();
    let worker = {
        let pool = Arc::clone(&pool);
        std::thread::spawn(move || {
            let mut held = Vec::with_capacity(16);
            let mut bulk = Vec::with_capacity(32);
            for _ in 0..100 {
                workload(&pool, &mut held, &mut bulk);
            }
            let warm = pool.stats();
            // The allocation witness works: this Box is counted.
            let heap = heap_operations();
            drop(std::hint::black_box(Box::new(7u64)));
            assert_eq!(
                heap_operations(),
                heap + 2,
                "the counting allocator sees alloc + free"
            );
            let traps_before = traps();
            let heap = heap_operations();
            forbid_system_calls();
            const ROUNDS: u64 = 10_000;
            for _ in 0..ROUNDS {
                workload(&pool, &mut held, &mut bulk);
            }
            let window = (traps() - traps_before, heap_operations() - heap);
            probe_system_call();
            let probed = traps() - traps_before;
            (window, probed, warm, ROUNDS)
        })
    };
    let ((syscalls, heap), probed, warm, rounds) = worker.join().expect("worker thread");
    if SYSCALL_WITNESS {
        assert_eq!(
            probed,
            syscalls + 1,
            "the seccomp witness traps a system call"
        );
        assert_eq!(syscalls, 0, "system calls in the steady-state window");
    }
    assert_eq!(heap, 0, "heap operations in the steady-state window");
    // The pool's own counters: every allocation of the window was a thread-cache hit; nothing
    // came from the shared lists, new slabs or the buddy allocator.
    let after = pool.stats();
    for ((w, a), b) in warm.classes.iter().zip(&after.classes).zip(&before.classes) {
        let allocs = a.allocs - w.allocs;
        assert_eq!(
            a.cache_hits - w.cache_hits,
            allocs,
            "class {}: all cache hits",
            a.size
        );
        assert_eq!(
            a.shared_hits, w.shared_hits,
            "class {}: no shared-list refill",
            a.size
        );
        assert_eq!(a.carved, w.carved, "class {}: no new blocks carved", a.size);
        assert_eq!(b.allocs, 0);
    }
    let window_allocs: u64 = after
        .classes
        .iter()
        .zip(&warm.classes)
        .map(|(a, w)| a.allocs - w.allocs)
        .sum();
    assert_eq!(window_allocs, rounds * (SIZES.len() as u64 + 16 + 32));
    assert_eq!(after.large.buddy_allocs, warm.large.buddy_allocs);
}

#[test]
fn cross_thread_pipeline_makes_no_system_call_and_no_heap_allocation() {
    const OBJECTS: u64 = 200_000;
    let pool = pool();
    let (mut tx, mut rx) = rtrb::RingBuffer::<Buffer<'static>>::new(256);
    // `Buffer<'static>` needs a pool that outlives the threads: leak one reference for the
    // test's duration and reclaim it after both threads are joined.
    let leaked: &'static Pool = unsafe_leak(Arc::clone(&pool));
    let start = Arc::new(Barrier::new(2));
    let producer_done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (start, done) = (Arc::clone(&start), Arc::clone(&producer_done));
        std::thread::spawn(move || {
            // Warm-up: free a batch so this thread has claimed its slot.
            drop(leaked.alloc(4096).unwrap());
            start.wait();
            let heap = heap_operations();
            let traps_before = traps();
            forbid_system_calls();
            let mut freed = 0u64;
            while freed < OBJECTS {
                match rx.pop() {
                    Ok(buffer) => {
                        drop(buffer);
                        freed += 1;
                    }
                    // The producer is gone (it panicked): stop, the count says so below.
                    Err(_) if done.load(Ordering::Acquire) && rx.is_empty() => break,
                    Err(_) => std::hint::spin_loop(),
                }
            }
            let window = (traps() - traps_before, heap_operations() - heap);
            probe_system_call();
            (window, traps() - traps_before, freed)
        })
    };
    let producer = {
        let (start, done) = (Arc::clone(&start), Arc::clone(&producer_done));
        std::thread::spawn(move || {
            // Tells the consumer to stop waiting when this thread ends, also by a panic.
            let _done = SetOnDrop(done);
            for _ in 0..1000 {
                drop(leaked.alloc(4096).unwrap());
            }
            start.wait();
            let heap = heap_operations();
            let traps_before = traps();
            forbid_system_calls();
            for _ in 0..OBJECTS {
                let mut buffer = leaked.alloc(4096).expect("pipeline allocation");
                loop {
                    match tx.push(buffer) {
                        Ok(()) => break,
                        Err(rtrb::PushError::Full(back)) => {
                            buffer = back;
                            std::hint::spin_loop();
                        }
                    }
                }
            }
            let window = (traps() - traps_before, heap_operations() - heap);
            probe_system_call();
            (window, traps() - traps_before)
        })
    };
    let ((p_syscalls, p_heap), p_probed) = producer.join().expect("producer");
    let ((c_syscalls, c_heap), c_probed, freed) = consumer.join().expect("consumer");
    assert_eq!(freed, OBJECTS, "every buffer crossed the ring");
    if SYSCALL_WITNESS {
        assert!(
            p_probed > p_syscalls && c_probed > c_syscalls,
            "the seccomp witness traps"
        );
        assert_eq!(
            (p_syscalls, c_syscalls),
            (0, 0),
            "system calls in the pipeline window"
        );
    }
    assert_eq!(
        (p_heap, c_heap),
        (0, 0),
        "heap operations in the pipeline window"
    );
    // SAFETY: both threads are joined; nothing borrows `leaked` any more.
    unsafe { unleak(leaked) };
    let stats = pool.stats();
    let class = stats.class_for(4096).unwrap();
    assert_eq!(class.allocs, class.frees);
    assert_eq!(class.in_use, 0);
    assert!(
        class.shared_hits > 0,
        "frees on one thread refilled the other through the depot"
    );
    assert_eq!(
        class.outstanding, 0,
        "both threads flushed their caches when they exited"
    );
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
}

/// Sets the flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A `&'static` to the pool behind `pool`, keeping one strong reference until [`unleak`].
fn unsafe_leak(pool: Arc<Pool>) -> &'static Pool {
    // SAFETY: the strong count taken here is given back by `unleak`, after which the caller
    // no longer uses the reference.
    unsafe { &*Arc::into_raw(pool) }
}

/// Gives back the reference [`unsafe_leak`] took.
///
/// # Safety
/// `pool` came from `unsafe_leak` and is not used afterwards.
unsafe fn unleak(pool: &'static Pool) {
    // SAFETY: the caller's contract: this is the pointer `Arc::into_raw` returned.
    drop(unsafe { Arc::from_raw(pool as *const Pool) });
}
