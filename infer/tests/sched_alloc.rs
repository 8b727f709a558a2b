//! `Scheduler::decide` allocates nothing: a counting global allocator around many decisions,
//! under every policy, for 2 to 64 streams, with and without maximum waits (forced frames
//! included), with streams coming and going and time going backwards now and then. Counted on
//! the deciding thread: the test harness's own thread may allocate meanwhile.

use userdma_infer::sched::{Nanos, Policy, Scheduler, StreamSpec};

#[global_allocator]
static GLOBAL: userdma_infer::stats::CountingAllocator = userdma_infer::stats::CountingAllocator;

#[test]
fn decide_allocates_nothing() {
    for n in [2, 4, 16, 64] {
        for policy in [
            Policy::RoundRobin,
            Policy::StrictPriority,
            Policy::Batch { k: 1 },
            Policy::Batch { k: 4 },
        ] {
            let specs = (0..n)
                .map(|i| {
                    let s = StreamSpec::new(format!("s{i}"), (i % 3) as u8, (i % 5) as u32);
                    if i % 2 == 1 {
                        s.with_max_wait(20_000 + 1_000 * i as Nanos)
                    } else {
                        s
                    }
                })
                .collect();
            let mut s = Scheduler::new(policy, specs).unwrap();
            let mut oldest: Vec<Option<Nanos>> = vec![Some(0); n];
            let before = userdma_infer::stats::thread_allocations();
            let mut forced = 0u64;
            for step in 0..20_000u64 {
                let now = if step % 997 == 0 {
                    step * 100
                } else {
                    step * 1_000
                };
                // Now and then a stream has nothing waiting.
                let idle = (step as usize * 7) % (2 * n);
                if idle < n {
                    oldest[idle] = None;
                }
                if let Some(d) = s.decide(now, &oldest) {
                    forced += u64::from(d.forced);
                    oldest[d.stream.0] = Some(now);
                }
                if idle < n {
                    oldest[idle] = Some(now);
                }
            }
            let allocs = userdma_infer::stats::thread_allocations() - before;
            assert_eq!(allocs, 0, "{policy}, {n} streams");
            assert_eq!(s.decisions(), 20_000);
            assert!(
                forced > 0,
                "{policy}, {n} streams: the max-wait path was exercised"
            );
        }
    }
}

#[test]
fn thread_allocations_count_the_calling_thread_only() {
    let other = std::thread::spawn(|| {
        let before = userdma_infer::stats::thread_allocations();
        let boxes: Vec<Box<u64>> = (0..100).map(Box::new).collect();
        let made = userdma_infer::stats::thread_allocations() - before;
        drop(boxes);
        made
    });
    let before = userdma_infer::stats::thread_allocations();
    let theirs = other.join().unwrap();
    assert!(theirs >= 100, "{theirs}");
    let spawned = userdma_infer::stats::thread_allocations() - before;
    assert!(
        spawned < 100,
        "the other thread's {theirs} are not this one's: {spawned}"
    );
    let before = userdma_infer::stats::thread_allocations();
    let one = std::hint::black_box(Box::new(7u64));
    assert_eq!(userdma_infer::stats::thread_allocations() - before, 1);
    drop(one);
}

/// Waiting on several devices' interrupts (what `Streams` does with more than one device)
/// allocates nothing, from the first wait: a waiter makes room for every registration's
/// readiness when the fd is added, not when it first reports it.
#[test]
fn waiting_on_several_interrupts_allocates_nothing_from_the_first_wait() {
    use std::time::Duration;
    use userdma::irq::{EventFd, Waiter};

    type Make = fn() -> Result<Waiter, userdma::irq::Error>;
    let backends: [(&str, Make); 2] = [
        ("io_uring", Waiter::with_io_uring),
        ("epoll", Waiter::with_epoll),
    ];
    for (name, make) in backends {
        let Ok(mut waiter) = make() else {
            // io_uring may be disabled (kernel.io_uring_disabled): epoll is then what runs.
            assert_eq!(name, "io_uring", "epoll is always there");
            continue;
        };
        let fds: Vec<EventFd> = (0..3).map(|_| EventFd::new().expect("eventfd")).collect();
        for (i, fd) in fds.iter().enumerate() {
            waiter.add(fd, i as u64).expect("registered");
        }
        let before = userdma_infer::stats::thread_allocations();
        for round in 0..100u64 {
            // All three at once, then one at a time.
            let which: &[usize] = if round % 2 == 0 {
                &[0, 1, 2]
            } else {
                &[(round % 3) as usize]
            };
            for &i in which {
                fds[i].signal().expect("signalled");
            }
            let ready = waiter
                .wait(Some(Duration::from_secs(5)))
                .expect("a wait")
                .len();
            assert_eq!(ready, which.len(), "{name}, round {round}");
            for &i in which {
                fds[i].read().expect("read back");
            }
        }
        let allocations = userdma_infer::stats::thread_allocations() - before;
        assert_eq!(allocations, 0, "{name}: waits allocated");
    }
}
