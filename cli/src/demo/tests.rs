use clap::Parser;

use super::placement::allowed_cpus;
use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: DemoArgs,
}

#[test]
fn arguments_parse_with_defaults() {
    let args = Cli::try_parse_from(["demo"]).unwrap().args;
    assert_eq!(
        (args.size, args.count, args.batch, args.depth, args.queues),
        (64 << 10, 2048, 8, 2, 2)
    );
    assert_eq!(
        (args.cost, args.engine_cpu, args.no_pin),
        (CostModel::Npu, None, false)
    );
    let args = Cli::try_parse_from(["demo", "--size", "1M", "--cost", "zero", "--process"])
        .unwrap()
        .args;
    assert_eq!(
        (args.size, args.cost, args.process),
        (1 << 20, CostModel::Zero, true)
    );
    for bad in ["3", "2M", "0", "x"] {
        assert!(
            Cli::try_parse_from(["demo", "--size", bad]).is_err(),
            "{bad}"
        );
    }
    assert!(Cli::try_parse_from(["demo", "--batch", "0"]).is_err());
    assert!(Cli::try_parse_from(["demo", "--depth", "5"]).is_err());
    assert!(Cli::try_parse_from(["demo", "--no-pin", "--engine-cpu", "0"]).is_err());
    assert!(Cli::try_parse_from(["demo", "--queues", "9"]).is_err());
}

#[test]
fn percentiles() {
    let mut h = histogram();
    for ns in (1..=1000).rev() {
        h.record(ns).unwrap();
    }
    let latency = Latency::of(&h);
    assert_eq!(
        (latency.p50, latency.p99, latency.p999, latency.max),
        (500, 990, 999, 1000)
    );
    assert_eq!(Latency::of(&histogram()).max, 0);
}

#[test]
fn a_small_run_verifies_every_byte() {
    let args = Cli::try_parse_from(["demo", "--size", "4K", "--count", "64", "--cost", "zero"])
        .unwrap()
        .args;
    run(&args, true).unwrap();
}

/// The lowest CPU this thread may run on.
fn first_allowed_cpu() -> usize {
    allowed_cpus()
        .expect("sched_getaffinity")
        .first()
        .copied()
        .expect("a CPU to run on")
}

#[test]
fn the_engine_can_be_pinned_and_a_bad_cpu_is_refused() {
    let demo = |cpu: &str| {
        let argv = [
            "demo",
            "--size",
            "4K",
            "--count",
            "16",
            "--cost",
            "zero",
            "--engine-cpu",
            cpu,
        ];
        let args = Cli::try_parse_from(argv).unwrap().args;
        run(&args, true)
    };
    demo(&first_allowed_cpu().to_string()).unwrap();
    // What `userdma` prints for it.
    let text = crate::exit::Failure::from(demo("4096").unwrap_err()).chain();
    assert!(
        text.contains("engine_cpu") && text.contains("taskset"),
        "{text}"
    );
    assert!(Cli::try_parse_from(["demo", "--engine-cpu", "x"]).is_err());
}
