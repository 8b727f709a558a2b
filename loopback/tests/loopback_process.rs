//! The loopback device out of process: its engine runs in a child process (this test binary
//! re-executed to run only its device-process test, tests/common/device_process.rs) that
//! reaches host memory only through the shared files mapped into the device's DMA space.
//!
//! `USERDMA_LOOPBACK_DEVICE_PROGRAM` may name another device program (one whose main calls
//! `userdma_loopback::serve_process`, such as the `userdma` tool, which has it as its
//! hidden `loopback-device` subcommand).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Device;
use userdma::dma::Mapping;
use userdma::memory::{PageSize, Region};
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{self, Config, Cost, Loopback, Mode, Opcode, Program, StatusCode, Wait};

mod procfs;

use procfs::allowed_cpus;

#[path = "common/device_process.rs"]
mod device_process;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

fn program() -> Program {
    match std::env::var_os("USERDMA_LOOPBACK_DEVICE_PROGRAM") {
        Some(path) => Program::new(PathBuf::from(path)),
        None => device_process::program(),
    }
}

/// An out-of-process, zero-cost device named `name`, to build on.
fn config(name: &str) -> Config {
    Config::default()
        .name(name)
        .cost(Cost::zero())
        .memory_size(4 << 20)
        .queues(2)
        .mode(Mode::Process(program()))
}

fn device(name: &str) -> Arc<Loopback> {
    device_with(config(name))
}

fn device_with(config: Config) -> Arc<Loopback> {
    match Loopback::new(config) {
        Ok(device) => Arc::new(device),
        Err(err) => panic!(
            "starting the out-of-process loopback device failed: {err} (source: {:?}); the \
             device program must serve it (`userdma_loopback::serve_process`)",
            std::error::Error::source(&err)
        ),
    }
}

fn shared_memory(device: &Loopback, len: usize) -> Mapping {
    userdma::runtime::map_memory(device.dma_space().as_ref(), len, PageSize::Base)
        .expect("host memory mapped into the device's DMA space")
}

fn cmd(op: Opcode, src: u64, dst: u64, len: u64) -> Command {
    Command {
        opcode: op as u8,
        src,
        dst,
        len,
        ..Command::default()
    }
}

/// Opens a queue and copies 64 bytes of `host` to the device through it (which must succeed).
fn one_copy(device: &Arc<Loopback>, host: &Mapping) -> Queue<Command, Status, ()> {
    let mut queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    assert!(run(
        &mut queue,
        cmd(Opcode::ToDevice, host.iova(0).unwrap().raw(), 0, 64)
    )
    .is_success());
    queue
}

fn run(queue: &mut Queue<Command, Status, ()>, command: Command) -> Status {
    queue.submit(command, ()).expect("submitted");
    queue.wait(TIMEOUT).expect("completed").entry
}

#[test]
fn the_engine_runs_in_another_process_and_moves_data() {
    let device = device("lb-remote");
    let pid = device.process_id().expect("a device process");
    assert_ne!(pid, std::process::id());
    assert!(device.is_running());
    // No engine thread in this process.
    for entry in std::fs::read_dir("/proc/self/task").unwrap() {
        let comm = std::fs::read_to_string(entry.unwrap().path().join("comm")).unwrap();
        assert_ne!(comm.trim(), "lb-remote");
    }

    let host = shared_memory(&device, 256 << 10);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 256) as u8).collect();
    host.slice().write_from(0, &data).unwrap();
    let mut queues: Vec<Queue<Command, Status, ()>> = (0..2)
        .map(|q| {
            device
                .open_queue(ring::Config::new(32).with_id(q), Wait::Interrupt)
                .unwrap()
        })
        .collect();
    let iova = host.iova(0).unwrap();
    let half = 50_000u64;
    for (q, queue) in queues.iter_mut().enumerate() {
        let at = q as u64 * half;
        let status = run(queue, cmd(Opcode::ToDevice, (iova + at).raw(), at, half));
        assert!(status.is_success(), "{status:?}");
    }
    let mut compute = cmd(Opcode::Compute, 0, 200_000, 100_000);
    compute.args = [0xdead_beef, 3, 0, 0];
    let status = run(&mut queues[0], compute);
    assert!(status.is_success());
    let status = run(
        &mut queues[1],
        cmd(Opcode::ToHost, 200_000, (iova + 120_000).raw(), 100_000),
    );
    assert!(status.is_success());
    let mut back = vec![0u8; 100_000];
    host.slice().read_into(120_000, &mut back).unwrap();
    let mut sum = 0u64;
    for (i, (word, out)) in data.chunks(4).zip(back.chunks(4)).enumerate() {
        let w = u32::from_le_bytes(word.try_into().unwrap());
        let expect = (w ^ 0xdead_beef).wrapping_add(3);
        sum = sum.wrapping_add(u64::from(expect));
        assert_eq!(out, expect.to_le_bytes(), "word {i}");
    }
    // The compute result (checked before the copy back) matches too.
    let _ = sum;
    let counters = device.counters().unwrap();
    assert_eq!((counters.descriptors, counters.errors), (4, 0));

    drop(queues);
    drop(device);
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the device process did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_device_process_reaches_only_what_is_mapped() {
    let device = device("lb-remote-map");
    let mut queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    // Anonymous memory cannot be shared with the device process.
    let anonymous = Region::builder(4096)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .unwrap();
    let err = device.dma_space().map(Arc::new(anonymous)).unwrap_err();
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    assert!(
        text.contains(".memfd()"),
        "the error says how to make shareable memory: {text}"
    );
    assert_eq!(
        device.dma_space().stats().maps,
        1,
        "only the ring is mapped"
    );

    let host = shared_memory(&device, 8192);
    host.slice().fill(0x42);
    let iova = host.iova(0).unwrap();
    assert!(run(&mut queue, cmd(Opcode::ToDevice, iova.raw(), 0, 8192)).is_success());
    let past = run(
        &mut queue,
        cmd(Opcode::ToDevice, (iova + 4096).raw(), 0, 8192),
    );
    assert_eq!(
        (past.code(), past.result),
        (StatusCode::HostUnmapped as u16, (iova + 4096).raw())
    );

    // Once unmapped on the host, the device process no longer reaches it.
    drop(host);
    let gone = run(&mut queue, cmd(Opcode::ToDevice, iova.raw(), 0, 64));
    assert_eq!(
        (gone.code(), gone.result),
        (StatusCode::HostUnmapped as u16, iova.raw())
    );
    // A new mapping may reuse the IOVAs: the device then reaches the new memory.
    let again = shared_memory(&device, 8192);
    again.slice().fill(0x17);
    let reused = again.iova(0).unwrap();
    assert!(run(&mut queue, cmd(Opcode::ToDevice, reused.raw(), 100, 16)).is_success());
    let mut back = [0u8; 16];
    device.device_memory().read_into(100, &mut back).unwrap();
    assert_eq!(back, [0x17; 16]);
}

#[test]
fn a_dead_device_process_is_reported_and_stops_its_queues() {
    let device = device("lb-remote-kill");
    let host = shared_memory(&device, 4096);
    let mut queue = one_copy(&device, &host);
    let pid = device.process_id().unwrap();
    let pid = i32::try_from(pid).unwrap();
    // SAFETY: sends SIGKILL to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let start = Instant::now();
    while device.is_running() {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(1));
    }
    // Work submitted now never completes, and dropping the queue does not leak: a dead device
    // touches nothing.
    queue
        .submit(
            cmd(Opcode::ToDevice, host.iova(0).unwrap().raw(), 0, 64),
            (),
        )
        .unwrap();
    assert!(queue.wait(Some(Duration::from_millis(50))).is_err());
    let leaks = ring::leaks();
    drop(queue);
    assert_eq!(ring::leaks(), leaks);
    let err = device.reset().expect_err("a stopped device process");
    assert!(
        matches!(
            userdma_loopback::Error::of(&err),
            Some(userdma_loopback::Error::Stopped { exit: Some(_) })
        ),
        "{err:?}"
    );
}

#[test]
fn the_device_process_runs_on_the_engine_cpu() {
    let cpu = *allowed_cpus("/proc/thread-self").last().unwrap();
    let device = device_with(config("lb-remote-pinned").engine_cpu(cpu));
    let pid = device.process_id().unwrap();
    // Every thread of the device process, the engine's included, is on that CPU: the device
    // process moves the threads it had before it knew its CPU (a test harness's, when the
    // process is this test binary; a sanitizer runtime's).
    let threads: Vec<_> = procfs::threads(&pid.to_string());
    for (dir, _) in &threads {
        assert_eq!(allowed_cpus(dir), vec![cpu], "{dir}");
    }
    assert!(
        threads.iter().any(|(_, name)| name == "loopback-engine"),
        "no engine thread in the device process"
    );
    one_copy(&device, &shared_memory(&device, 4096));

    // A CPU no process can use: the device process refuses it and the host says which.
    let err = Loopback::new(config("lb-remote-bad-cpu").engine_cpu(4096)).expect_err("CPU 4096");
    match userdma_loopback::Error::of(&err) {
        Some(userdma_loopback::Error::Config { field, value, .. }) => {
            assert_eq!((*field, *value), ("engine_cpu", 4096));
        }
        _ => panic!("{err:?}"),
    }
}

/// A device in a process of its own mirrors no access modes into its table: a
/// device-read-only or -write-only mapping is refused when it is made, saying why and what to
/// do, and nothing stays mapped.
#[test]
fn a_device_process_refuses_access_modes_it_cannot_enforce() {
    use userdma::dma::Access;
    let device = device("access-modes");
    let space = device.dma_space();
    for access in [Access::ReadOnly, Access::WriteOnly] {
        let region = Region::builder(4096)
            .page_size(PageSize::Base)
            .memfd()
            .lock(false)
            .build()
            .unwrap();
        let err = space.map_with(Arc::new(region), access).unwrap_err();
        let text = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(text.contains("read-write only"), "{text}");
        assert_eq!(space.stats().live_bytes, 0);
    }
}
