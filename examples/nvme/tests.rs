//! The driver run end to end against the software controller (`fake`), and the CLI.

use super::*;
use clap::CommandFactory;

use crate::fake::{FakeController, Faults, LBA_SIZE};

/// Arguments for a run against the fake controller (base pages: no hugepages needed).
fn fake_args(extra: &[&str]) -> Args {
    let base = ["nvme", "0000:00:04.0", "--base-pages", "--pool-mib", "2"];
    let all: Vec<&str> = base.iter().chain(extra).copied().collect();
    Args::try_parse_from(all).expect("valid arguments")
}

/// A runtime that owns the fake controller.
fn runtime(fake: &FakeController) -> Runtime {
    Runtime::from_device(fake.device())
}

fn count(fake: &FakeController, qid: u16, opcode: u8) -> u32 {
    fake.seen()
        .commands
        .get(&(qid, opcode))
        .copied()
        .unwrap_or(0)
}

#[test]
fn drives_a_controller_end_to_end() {
    let fake = FakeController::new(Faults::default());
    let args = fake_args(&["--lba", "10", "--blocks", "300", "--seed", "5"]);
    drive(&args, &runtime(&fake)).expect("a clean run");

    // The disk holds the pattern at the blocks written, and nothing anywhere else.
    let disk = fake.disk.lock().expect("disk").clone();
    let (start, end) = (10 * LBA_SIZE, 310 * LBA_SIZE);
    assert!(disk[start..end] == pattern::pattern(5, 10, 300, 512)[..]);
    assert!(disk[..start].iter().chain(&disk[end..]).all(|&b| b == 0));

    let chunks = prp::plan(10, 300, 512, io::MAX_CHUNK).len() as u32;
    let seen = fake.seen();
    assert_eq!(count(&fake, 1, command::nvm::WRITE), chunks);
    assert_eq!(count(&fake, 1, command::nvm::READ), chunks);
    assert_eq!(count(&fake, 1, command::nvm::FLUSH), 1);
    assert_eq!(count(&fake, 0, command::admin::IDENTIFY), 2);
    assert_eq!(count(&fake, 0, command::admin::SET_FEATURES), 1);
    assert_eq!(count(&fake, 0, command::admin::CREATE_IO_CQ), 1);
    assert_eq!(count(&fake, 0, command::admin::CREATE_IO_SQ), 1);
    assert_eq!(count(&fake, 0, command::admin::DELETE_IO_SQ), 1);
    assert_eq!(count(&fake, 0, command::admin::DELETE_IO_CQ), 1);
    // Every PRP shape, both ways.
    assert!(seen.prp_lists >= 6, "{seen:?}");
    assert!(seen.in_page >= 4, "{seen:?}");
    assert_eq!((seen.enables, seen.shutdowns), (1, 1));
    assert!(seen.failed.is_empty(), "{seen:?}");

    // A second run reads what the first wrote, and writes nothing.
    let again = fake_args(&[
        "--lba",
        "10",
        "--blocks",
        "300",
        "--seed",
        "5",
        "--verify-only",
    ]);
    drive(&again, &runtime(&fake)).expect("the data persisted");
    assert_eq!(count(&fake, 1, command::nvm::WRITE), chunks);
    assert_eq!(count(&fake, 1, command::nvm::READ), 2 * chunks);

    // Another seed does not match: exit status 3, and the controller is left shut down.
    let wrong = fake_args(&[
        "--lba",
        "10",
        "--blocks",
        "300",
        "--seed",
        "6",
        "--verify-only",
    ]);
    let err = drive(&wrong, &runtime(&fake)).expect_err("another seed's pattern differs");
    assert_eq!(err.exit_code(), 3, "{err:?}");
    assert_eq!(fake.seen().shutdowns, 3);
}

#[test]
fn corrupted_reads_are_caught() {
    let fake = FakeController::new(Faults {
        corrupt_reads: true,
        ..Faults::default()
    });
    let args = fake_args(&["--blocks", "20"]);
    let err = drive(&args, &runtime(&fake)).expect_err("the reads are corrupted");
    assert_eq!(err.exit_code(), 3, "{err:?}");
    assert!(matches!(
        &err,
        Error::Io { source, .. } if matches!(**source, io::Error::Mismatch { byte: 0, .. })
    ));
}

#[test]
fn reads_that_move_no_data_are_caught() {
    // The read buffers may be the very blocks the writes used (the pool hands freed blocks
    // back): only the poison they are filled with shows that nothing arrived.
    let fake = FakeController::new(Faults {
        empty_reads: true,
        ..Faults::default()
    });
    let args = fake_args(&["--blocks", "1"]);
    let err = drive(&args, &runtime(&fake)).expect_err("the reads move nothing");
    assert_eq!(err.exit_code(), 3, "{err:?}");
}

#[test]
fn a_failed_admin_command_names_its_status() {
    let fake = FakeController::new(Faults::default());
    let args = fake_args(&["--nsid", "2"]);
    let err = drive(&args, &runtime(&fake)).expect_err("namespace 2 does not exist");
    assert_eq!(err.exit_code(), 1);
    let text = format!("{:?}", err);
    assert!(text.contains("Identify Namespace"), "{text}");
    assert_eq!(fake.seen().failed, vec![0x0b]);
}

#[test]
fn a_range_past_the_namespace_is_refused_before_any_io() {
    let fake = FakeController::new(Faults::default());
    let args = fake_args(&["--lba", "2000", "--blocks", "100"]);
    let err = drive(&args, &runtime(&fake)).expect_err("past the end");
    assert_eq!(err.exit_code(), 2);
    assert_eq!(count(&fake, 1, command::nvm::WRITE), 0);
    assert_eq!(count(&fake, 0, command::admin::CREATE_IO_SQ), 0);
    assert_eq!(fake.seen().shutdowns, 1);
}

/// CC.EN and CSTS.RDY of the fake.
fn enabled_and_ready(fake: &FakeController) -> (bool, bool) {
    let cc = fake.bar.read::<u32>(0x14).expect("CC");
    let csts = fake.bar.read::<u32>(0x1c).expect("CSTS");
    (cc & 1 != 0, csts & 1 != 0)
}

#[test]
fn a_queue_dropped_while_the_controller_serves_it_disables_the_controller() {
    let fake = FakeController::new(Faults::default());
    let runtime = runtime(&fake);
    let bar = runtime.device().bar(0).expect("BAR0");
    let controller = Controller::new(bar).expect("a controller");
    controller.disable().expect("disabled");
    let admin_queue = controller
        .open_queue(&runtime, ADMIN_QID, ADMIN_DEPTH)
        .expect("the admin queue");
    // ASQ/ACQ name its rings now: it cannot be opened twice.
    let again = controller.open_queue(&runtime, ADMIN_QID, ADMIN_DEPTH);
    assert!(
        matches!(
            &again,
            Err(controller::Error::Open { source, .. })
                if matches!(**source, userdma::Error::Device(device::Error::QueueBusy { queue: 0 }))
        ),
        "{again:?}"
    );
    controller.enable().expect("enabled");
    let mut admin = Admin {
        queue: admin_queue,
        controller: controller.clone(),
        timeout: Duration::from_secs(5),
    };
    admin.set_queue_count().expect("one I/O queue pair");

    // Deleted on the controller first: dropping the ring changes nothing there.
    let io = controller
        .open_queue(&runtime, IO_QID, 16)
        .expect("an I/O queue");
    admin.create_io_queues(&io, IO_VECTOR).expect("created");
    admin.delete_io_queues(IO_QID).expect("deleted");
    drop(io);
    assert_eq!(enabled_and_ready(&fake), (true, true));

    // Still served by the controller: dropping the ring disables the controller first.
    let io = controller
        .open_queue(&runtime, IO_QID, 16)
        .expect("the I/O queue again");
    admin.create_io_queues(&io, IO_VECTOR).expect("created");
    drop(io);
    assert_eq!(enabled_and_ready(&fake), (false, false));
    assert!(!controller.live().contains(ADMIN_QID));
    drop(admin);
    assert_eq!(fake.seen().enables, 1);
}

#[test]
fn cli_is_consistent() {
    Args::command().debug_assert();
}

#[test]
fn cli_parses_the_documented_form() {
    let args = Args::try_parse_from([
        "nvme",
        "0000:00:04.0",
        "--blocks",
        "200",
        "--seed",
        "7",
        "--lba",
        "16",
        "--verify-only",
    ])
    .expect("valid arguments");
    assert_eq!(args.bdf.to_string(), "0000:00:04.0");
    assert_eq!((args.blocks, args.seed, args.lba), (200, 7, 16));
    assert!(args.verify_only);
    assert!(Args::try_parse_from(["nvme", "not-a-bdf"]).is_err());
    assert!(Args::try_parse_from(["nvme"]).is_err());
}

#[test]
fn floor_pow2_rounds_down() {
    assert_eq!(floor_pow2(32), 32);
    assert_eq!(floor_pow2(33), 32);
    assert_eq!(floor_pow2(2048), 2048);
    assert_eq!(floor_pow2(3), 2);
    assert_eq!(floor_pow2(0), 1);
}

#[test]
fn mismatches_exit_with_3() {
    let err = Error::Io {
        bdf: "0000:00:04.0".parse().expect("bdf"),
        nsid: 1,
        source: Box::new(io::Error::Mismatch {
            lba: 0,
            byte: 0,
            want: 1,
            got: 2,
            differ: 1,
            len: 512,
            seed: 1,
        }),
    };
    assert_eq!(err.exit_code(), 3);
    assert_eq!(Error::Argument(String::new()).exit_code(), 2);
}
