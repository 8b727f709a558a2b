//! A first transfer: host memory -> device memory -> host memory on the software loopback
//! device, through the runtime. Run it with `cargo run --example first_transfer`; change
//! `Runtime::loopback(..)` to `Runtime::open(bdf)` for a device bound to vfio-pci or uio.

use std::time::Duration;

use userdma::device::loopback::{self, Descriptor};
use userdma::memory::PageSize;
use userdma::{ring, Runtime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One owner of the device, its DMA space, its memory and its queues.
    let runtime = Runtime::loopback(loopback::Config::default())?;
    let pool = runtime.pool(4 << 20, PageSize::Base)?; // mapped into the device once
    let window = runtime.device_memory()?.alloc(4096, 256)?; // a range of device memory
    let mut queue = runtime.queue(ring::Config::new(64))?;

    let source = pool.alloc_owned(4096)?;
    source.write(0, b"hello, device")?;
    let destination = pool.alloc_owned(4096)?;
    let (src, dst) = (source.iova(), destination.iova());

    // Two descriptors, one doorbell; each buffer belongs to the queue until it completes.
    queue.push(
        Descriptor::to_device(src, window.offset(), 13).build(),
        source,
    )?;
    queue.push(
        Descriptor::to_host(window.offset(), dst, 13).build(),
        destination,
    )?;
    queue.flush()?;

    let timeout = Some(Duration::from_secs(5));
    let there = queue.wait(timeout)?;
    let back = queue.wait(timeout)?;
    for done in [&there, &back] {
        if !done.entry.is_success() {
            let code = done.entry.loopback_code();
            return Err(format!("the device failed a descriptor: {code:?}").into());
        }
    }
    let mut text = [0u8; 13];
    back.payload.read(0, &mut text)?;
    println!(
        "{} -> device {} -> {}: {:?}",
        there.payload.iova(),
        window.offset(),
        back.payload.iova(),
        String::from_utf8_lossy(&text)
    );
    assert_eq!(&text, b"hello, device");
    Ok(())
}
