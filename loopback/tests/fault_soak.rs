//! Fault soak: 10^7 random round trips (1 to 512 bytes, random offsets, every byte checked)
//! through a loopback device that injects every kind of fault at random, about 1 in 10^4
//! descriptors; then no corrupted byte, no leaked buffer, every injected fault detected on the
//! host (or, in a burst already being recovered, masked by that recovery), and the device
//! usable after every recovery. See `userdma_loopback::fault::soak`.
//!
//! `USERDMA_FAULT_SOAK_TRANSFERS` sets the number of round trips (default 10^7 in a release
//! build, 10^5 in a debug one). Run it optimised, as CI does:
//!
//! ```text
//! cargo test --release --locked --test fault_soak
//! ```

use userdma_loopback::fault::soak::{self, Plan};
use userdma_loopback::fault::Kind;

fn transfers() -> u64 {
    match std::env::var("USERDMA_FAULT_SOAK_TRANSFERS") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("USERDMA_FAULT_SOAK_TRANSFERS={text:?} is not a number")),
        Err(_) if cfg!(debug_assertions) => 100_000,
        Err(_) => 10_000_000,
    }
}

#[test]
fn every_injected_fault_is_detected_and_recovered_from() {
    let mut plan = Plan {
        transfers: transfers(),
        seed: 0x5eed,
        ..Plan::default()
    };
    if let Ok(rate) = std::env::var("USERDMA_FAULT_SOAK_RATE") {
        plan.rate = rate
            .parse()
            .expect("USERDMA_FAULT_SOAK_RATE is a probability");
    }
    if let Ok(burst) = std::env::var("USERDMA_FAULT_SOAK_BURST") {
        plan.burst = burst.parse().expect("USERDMA_FAULT_SOAK_BURST is a count");
    }
    let report = soak::run(&plan, |_| {}).expect("the soak runs");
    println!("fault soak: {}", report.summary());
    for kind in Kind::ALL {
        println!(
            "  {kind:>8}: injected {:>5}, detected {:>5}, masked {:>3}, recovered {:>5}",
            report.injected.get(kind),
            report.detected.get(kind),
            report.masked.get(kind),
            report.recovered.get(kind)
        );
    }
    assert!(report.unreconciled.is_empty(), "{:#?}", report.unreconciled);
    assert_eq!(report.corrupted_bytes, 0);
    assert_eq!(report.leaked_buffers, 0);
    assert_eq!(report.transfers, plan.transfers);
    for kind in Kind::ALL {
        assert_eq!(
            report.injected.get(kind),
            report.detected.get(kind) + report.masked.get(kind),
            "{kind}"
        );
    }
    assert!(report.is_clean());
    if plan.transfers >= 1_000_000 {
        // At 10^-4 per descriptor, two descriptors per transfer: every kind is hit.
        for kind in Kind::ALL {
            assert!(report.injected.get(kind) > 0, "{kind} never injected");
            assert!(
                report.recovered.get(kind) > 0,
                "{kind} never recovered from"
            );
        }
    }
    assert!(report.verified > plan.transfers * 9 / 10);
}
