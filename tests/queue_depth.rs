//! A queue depth the device does not take is the caller's error, found before the device is
//! touched: `InvalidArgument` naming the device's largest depth, no fault left behind, and a
//! queue of an allowed depth opens at once on the same index.
#![cfg(not(loom))]

use std::sync::Arc;

use userdma::device::{self, Wait};
use userdma::ring::{self, Command, Queue, Status};
use userdma::{Code, Error};
use userdma_loopback::{Config, Cost, Loopback};

fn device(max_depth: u32) -> Arc<Loopback> {
    let config = Config::default()
        .cost(Cost::zero())
        .memory_size(1 << 20)
        .queues(2)
        .max_depth(max_depth);
    Arc::new(Loopback::new(config).expect("loopback device"))
}

fn open(device: &Arc<Loopback>, depth: u32) -> Result<Queue<Command, Status, ()>, device::Error> {
    device.open_queue(ring::Config::new(depth).with_id(1), Wait::Interrupt)
}

#[test]
fn a_depth_above_the_devices_largest_is_refused_before_the_device_is_touched() {
    for (max, too_deep) in [(1024u32, 2048u32), (1024, 8192), (64, 128), (4096, 1 << 15)] {
        let device = device(max);
        let error = open(&device, too_deep).expect_err("deeper than the device takes");
        let message = error.to_string();
        assert!(
            matches!(error, device::Error::QueueDepth { depth, max: m, .. } if depth == too_deep && m == max),
            "{error:?}"
        );
        assert!(message.contains(&max.to_string()), "{message}");
        assert_eq!(Error::from(error).code(), Code::InvalidArgument);
        // Nothing was written to the device: the same queue opens at once at the largest
        // depth (a queue left faulted would refuse it with QueueBusy).
        let queue = open(&device, max).expect("the largest depth opens at once");
        drop(queue);
    }
}

#[test]
fn a_depth_that_is_not_a_power_of_two_is_refused_too() {
    let device = device(1024);
    for depth in [0u32, 1, 3, 1000] {
        let error = open(&device, depth).expect_err("not a power of two from 2");
        assert_eq!(
            Error::from(error).code(),
            Code::InvalidArgument,
            "depth {depth}"
        );
    }
    open(&device, 2).expect("depth 2 opens");
}
