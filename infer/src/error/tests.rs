//! Each inference error's code: the planner's, the model's, the pipeline's, the scheduler's,
//! the streams' and staging's errors (once strings with `InvalidArgument` in the driver's
//! error), and a driver error's code passed through.

use std::time::Duration;

use super::*;
use crate::sched::streams;

/// Asserts each error's code and that its message is the wrapped error's (or its own).
fn check(table: Vec<(Error, Code)>) {
    for (e, code) in table {
        assert_eq!(e.code(), code, "{e:?}");
        assert!(!e.to_string().is_empty(), "{e:?}");
    }
}

#[test]
fn driver_and_staging_errors_keep_their_codes() {
    let e: Error = userdma::pool::Error::Exhausted {
        len: 4096,
        waited: Duration::ZERO,
    }
    .into();
    assert_eq!(e.code(), Code::Exhausted);
    assert!(matches!(e, Error::Driver(_)), "{e:?}");
    check(vec![
        (stage::Error::Idle.into(), Code::InvalidArgument),
        (
            stage::Error::Cancelled {
                op: stage::Op::Read,
                path: "/tmp/frames".into(),
                offset: 0,
            }
            .into(),
            Code::System,
        ),
    ]);
}

/// The planner's, the model's, the pipeline's, the scheduler's and the streams' errors,
/// once strings in `Error::Invalid` (`InvalidArgument`), keep that code as typed errors;
/// a model without host memory is `Exhausted`, as the C API has always said.
#[test]
fn planner_model_pipeline_and_scheduler_errors_keep_their_codes() {
    let invalid = Code::InvalidArgument;
    let tensor = || "tensor 1".to_owned();
    check(vec![
        (
            plan::Error::TooManyTensors { count: 9, max: 8 }.into(),
            invalid,
        ),
        (plan::Error::Alignment { align: 3 }.into(), invalid),
        (plan::Error::ZeroSize { tensor: tensor() }.into(), invalid),
        (
            plan::Error::Interval {
                tensor: tensor(),
                first: 2,
                last: 1,
            }
            .into(),
            invalid,
        ),
        (
            plan::Error::DuplicateId {
                tensor: tensor(),
                id: 1,
            }
            .into(),
            invalid,
        ),
        (
            plan::Error::UnknownInput {
                tensor: tensor(),
                input: 7,
            }
            .into(),
            invalid,
        ),
        (
            plan::Error::Misaligned {
                tensor: tensor(),
                offset: 3,
                align: 4,
            }
            .into(),
            invalid,
        ),
        (
            plan::Error::FixedCollision {
                tensor: tensor(),
                offset: 0,
                end: 8,
                other: "tensor 2".into(),
            }
            .into(),
            invalid,
        ),
        (
            plan::Error::Overflow {
                tensor: tensor(),
                what: "the sum",
            }
            .into(),
            invalid,
        ),
    ]);
    use pipeline::ModelError as M;
    let what = || "the input".to_owned();
    check(vec![
        (
            M::OutOfArena {
                what: what(),
                offset: 0,
                bytes: 8,
                arena: 4,
            }
            .into(),
            invalid,
        ),
        (
            M::Misaligned {
                what: what(),
                offset: 1,
                bytes: 4,
            }
            .into(),
            invalid,
        ),
        (M::Empty { what: what() }.into(), invalid),
        (M::Missing("input").into(), invalid),
        (M::Unplanned(3).into(), invalid),
        (
            M::Overlap {
                step: 1,
                offset: 0,
                bytes: 4,
            }
            .into(),
            invalid,
        ),
        (
            M::TooLarge {
                what: "layers",
                value: 9,
                max: 8,
                hint: "fewer",
            }
            .into(),
            invalid,
        ),
        (
            M::NoHostMemory {
                what: "the arena",
                bytes: 1 << 40,
            }
            .into(),
            Code::Exhausted,
        ),
        (
            M::Short {
                what: "input",
                len: 1,
                need: 4,
            }
            .into(),
            invalid,
        ),
        (M::Plan(plan::Error::Alignment { align: 0 }).into(), invalid),
        (
            M::Filter {
                record: 3,
                score_at: 0,
                bytes: 64,
            }
            .into(),
            invalid,
        ),
        (
            M::Unrunnable {
                why: "a layer with 0 inputs (give 1 to 3)".to_owned(),
            }
            .into(),
            invalid,
        ),
    ]);
    use pipeline::Error as P;
    check(vec![
        (P::Depth { depth: 0, batch: 1 }.into(), invalid),
        (
            P::Queues {
                queue: u16::MAX,
                after: 2,
            }
            .into(),
            invalid,
        ),
        (
            P::HostBuffers {
                depth: 1024,
                slot_bytes: u64::MAX / 1024,
            }
            .into(),
            invalid,
        ),
        (
            P::ResultCopy {
                bytes: 64,
                code: 3,
                status: "BadContext",
            }
            .into(),
            invalid,
        ),
        (
            P::OutsideResult {
                offset: 61,
                len: 4,
                size: 64,
            }
            .into(),
            invalid,
        ),
        (P::EmptyMapping { what: "input" }.into(), invalid),
        (
            P::Lacks {
                device: "memory-engine".to_owned(),
                kind: "host memory",
                lacks: "ordering across queues",
                setting: "a split pipeline",
                hint: "build the pipeline without Config::split (one in-order queue)",
            }
            .into(),
            invalid,
        ),
        (
            P::Arena {
                device: "memory-engine".to_owned(),
                bytes: 4096,
                align: 256,
                at: 8,
                why: "is not aligned to 256 bytes".to_owned(),
            }
            .into(),
            Code::Device,
        ),
    ]);
    use sched::Error as S;
    let name = || "cam".to_owned();
    let scheduler = vec![
        S::NoStreams,
        S::TooManyStreams { count: 65, max: 64 },
        S::ZeroBatch,
        S::ZeroMaxWait { stream: name() },
        S::EmptyName { index: 0 },
        S::DuplicateName {
            name: name(),
            first: 0,
            second: 1,
        },
    ];
    check(
        scheduler
            .iter()
            .map(|e| (e.clone().into(), invalid))
            .collect(),
    );
    use streams::Error as T;
    let mut on_streams = vec![
        T::ZeroInFlight,
        T::NoStreams,
        T::Context {
            stream: name(),
            context: 9,
            pipeline: 1,
        },
        T::ZeroPeriod { stream: name() },
        T::DuplicateName {
            name: name(),
            first: 0,
            second: 1,
        },
        T::Recovery {
            max_faults: 0,
            max_resets: 1,
        },
        T::Backoff {
            backoff: Duration::ZERO,
            max_backoff: Duration::from_secs(1),
        },
    ];
    for (device, source) in [None, Some(1)].into_iter().zip(scheduler) {
        on_streams.push(T::Scheduler { device, source });
    }
    check(
        on_streams
            .into_iter()
            .map(|e| (e.into(), invalid))
            .collect(),
    );
    let e: Error = T::Scheduler {
        device: Some(1),
        source: S::ZeroBatch,
    }
    .into();
    assert!(
        e.to_string()
            .starts_with("device 1: batch switching with K = 0"),
        "{e}"
    );
    let e: Error = T::Scheduler {
        device: None,
        source: S::ZeroBatch,
    }
    .into();
    assert!(e.to_string().starts_with("batch switching"), "{e}");
}

#[test]
fn a_callers_own_failure_is_handed_back_as_it_was() {
    let e = Error::caller("camera 2 sent no frame");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.to_string(), "camera 2 sent no frame");
    let io = Error::caller(std::io::Error::other("short read"));
    let Error::Caller(inner) = &io else {
        panic!("{io:?}");
    };
    assert!(inner.downcast_ref::<std::io::Error>().is_some());
}
