//! A first transfer: host memory -> device memory -> host memory on the software loopback
//! device, through the runtime (the README shows this file). Run it with
//! `cargo run --example first_transfer`. For a device bound to vfio-pci or uio_pci_generic,
//! `Runtime::open(bdf)` opens it and `runtime.open_queue(format, config, wait)` its queues in
//! its driver's format (docs/own-device.md); the rest is the same.

use std::time::Duration;
use userdma::memory::PageSize;
use userdma::{ring, Runtime};
use userdma_loopback::{self as loopback, Descriptor, LoopbackRuntime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = Runtime::loopback(loopback::Config::default())?; // or Runtime::open(bdf)
    let pool = runtime.pool(4 << 20, PageSize::Base)?; // mapped into the device once
    let window = runtime.device_memory()?.alloc(4096, 256)?; // a range of device memory
    let mut queue = runtime.queue(ring::Config::new(64))?;

    let source = pool.alloc_owned(4096)?;
    source.write(0, b"hello, device")?;
    let back = pool.alloc_owned(4096)?;
    let (src, dst) = (source.iova(), back.iova());
    let at = window.offset();
    queue.push(Descriptor::to_device(src, at, 13).build(), source)?;
    queue.push(Descriptor::to_host(at, dst, 13).build(), back)?;
    queue.flush()?; // one doorbell for both

    let timeout = Some(Duration::from_secs(5));
    assert!(queue.wait(timeout)?.entry.is_success());
    let done = queue.wait(timeout)?; // the buffer comes back
    let mut text = [0u8; 13];
    done.payload.read(0, &mut text)?;
    assert_eq!(&text, b"hello, device");
    Ok(())
}
