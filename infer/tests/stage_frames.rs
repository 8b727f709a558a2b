//! A file of frames read straight into the pipeline's input slots and the results written
//! straight from its result buffers ([`FrameSource`], [`FrameSink`]): every result checked
//! byte for byte against the model run on the host; the end of the file, a short last frame,
//! a stager over another pool, misaligned direct frames and in-place results refused.

#[path = "frames/mod.rs"]
mod frames;

use std::path::{Path, PathBuf};

use userdma::memory::PageSize;
use userdma::Runtime;
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_infer::stage::{self, Direct, Error, File, FrameSink, FrameSource, Mode, Pull, Stager};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

const FRAME: usize = 4096;

fn runtime() -> Runtime {
    Runtime::loopback(loopback::Config::default().cost(Cost::zero())).expect("loopback device")
}

fn model() -> Model {
    Model::chain(3, FRAME as u64).expect("model")
}

fn pipeline(rt: &Runtime, depth: usize, results: Results) -> Pipeline {
    let config = Config {
        depth,
        results,
        ..Config::default()
    };
    Pipeline::new(rt, model(), config).expect("pipeline")
}

fn stager(pipeline: &Pipeline) -> Stager {
    Stager::new(pipeline.pool().clone(), stage::Config::default().depth(4)).expect("stager")
}

/// A file of `frames` frames (frame n as `frames::fill` makes it) and `tail` more bytes.
fn frame_file(dir: &Path, name: &str, frames: u64, tail: usize) -> PathBuf {
    std::fs::create_dir_all(dir).expect("directory");
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let mut data = vec![0u8; frames as usize * FRAME + tail];
    for (n, chunk) in data.chunks_mut(FRAME).enumerate() {
        let mut frame = vec![0u8; FRAME];
        frames::fill(0, n as u64, &mut frame);
        chunk.copy_from_slice(&frame[..chunk.len()]);
    }
    std::fs::write(&path, data).expect("write frames");
    path
}

fn disk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stage-frames")
}

fn shm_dir() -> PathBuf {
    PathBuf::from("/dev/shm/userdma-stage-frames")
}

/// Runs the file through a pipeline into a result file and checks every result against the
/// model, byte for byte.
fn frames_through_the_pipeline(dir: &Path, direct: Direct, frames: u64, depth: usize) -> Mode {
    let rt = runtime();
    let model = model();
    let mut p = pipeline(&rt, depth, Results::Copy);
    let input = frame_file(dir, &format!("in-{depth}"), frames, 0);
    let out = dir.join(format!("out-{depth}-{}", std::process::id()));
    let file = File::open(&input, direct).expect("open frames");
    let mode = file.mode();
    let mut source = FrameSource::new(stager(&p), file, FRAME).expect("source");
    let sink_file = File::create(&out, direct).expect("create results");
    let mut sink = FrameSink::new(stager(&p), sink_file).expect("sink");
    let mut seen = Vec::new();
    let summary = source
        .run(&mut p, |done| {
            let output = done.result.expect("no device error");
            let index = sink.write(&output).expect("result written");
            assert_eq!(index, done.frame, "results are written in frame order");
            seen.push(done.frame);
        })
        .expect("run");
    assert!(source.is_done());
    assert_eq!(source.frames_read(), frames);
    assert_eq!(summary.frames, frames);
    assert_eq!(summary.failed, 0);
    assert_eq!(seen, (0..frames).collect::<Vec<_>>());
    assert_eq!(sink.written(), frames);
    assert_eq!(source.submit(&mut p).expect("after the end"), Pull::End);
    drop(sink);
    let written = std::fs::read(&out).expect("read results");
    let result_bytes = model.result().bytes as usize;
    assert_eq!(written.len(), frames as usize * result_bytes);
    for n in 0..frames {
        let at = n as usize * result_bytes;
        assert!(
            written[at..at + result_bytes] == frames::expected(&model, 0, n)[..],
            "result of frame {n} in the file differs from the model's"
        );
    }
    p.shutdown(|_| panic!("nothing left in flight"))
        .expect("shutdown");
    std::fs::remove_file(input).ok();
    std::fs::remove_file(out).ok();
    mode
}

#[test]
fn frames_from_a_tmpfs_file_through_the_pipeline_match_the_model_in_the_result_file() {
    for depth in [1, 2, 4] {
        let mode = frames_through_the_pipeline(&shm_dir(), Direct::Prefer, 13, depth);
        assert_eq!(mode, Mode::Buffered, "tmpfs has no direct I/O");
    }
}

#[test]
fn frames_from_the_build_disk_with_direct_io_match_the_model_in_the_result_file() {
    // The build directory's file system supports O_DIRECT (ext4, xfs, btrfs): Require.
    let mode = frames_through_the_pipeline(&disk_dir(), Direct::Require, 24, 3);
    assert_eq!(mode, Mode::Direct);
}

#[test]
fn an_empty_file_is_no_frames_and_the_end_is_clean() {
    let rt = runtime();
    let mut p = pipeline(&rt, 2, Results::Copy);
    let path = frame_file(&shm_dir(), "empty", 0, 0);
    let file = File::open(&path, Direct::Off).expect("open");
    let mut source = FrameSource::new(stager(&p), file, FRAME).expect("source");
    assert_eq!(source.submit(&mut p).expect("end"), Pull::End);
    assert!(source.is_done());
    assert_eq!(p.in_flight(), 0, "no frame was submitted");
    let summary = source.run(&mut p, |_| panic!("no frames")).expect("run");
    assert_eq!(summary.frames, 0);
    std::fs::remove_file(path).ok();
}

#[test]
fn a_short_last_frame_is_an_error_that_says_so() {
    let rt = runtime();
    let model = model();
    let mut p = pipeline(&rt, 2, Results::Copy);
    let path = frame_file(&shm_dir(), "short", 3, 100);
    let file = File::open(&path, Direct::Off).expect("open");
    let mut source = FrameSource::new(stager(&p), file, FRAME).expect("source");
    let mut good = 0;
    let err = source
        .run(&mut p, |done| {
            let output = done.result.expect("no device error");
            let mut got = vec![0u8; output.len()];
            output.read(0, &mut got).expect("read");
            assert_eq!(got, frames::expected(&model, 0, done.frame));
            good += 1;
        })
        .expect_err("the last frame is short");
    match err {
        userdma_infer::Error::Stage(Error::ShortFrame {
            frame,
            got,
            frame_bytes,
            ..
        }) => {
            assert_eq!((frame, got, frame_bytes), (3, 100, FRAME));
        }
        other => panic!("expected ShortFrame, got {other}"),
    }
    assert!(err_text(&path).contains("ends inside frame 3"));
    assert!(!source.is_done());
    // The three whole frames still come out, and the pipeline is whole.
    p.wait(|done| {
        assert!(done.result.is_ok());
        good += 1;
    })
    .ok();
    let summary = p.shutdown(|_| good += 1).expect("shutdown");
    assert_eq!(summary.frames, 3);
    assert_eq!(good, 3);
    std::fs::remove_file(path).ok();
}

fn err_text(path: &Path) -> String {
    Error::ShortFrame {
        path: path.to_owned(),
        frame: 3,
        got: 100,
        frame_bytes: FRAME,
    }
    .to_string()
}

#[test]
fn a_stager_over_another_pool_is_refused_and_the_slot_is_unharmed() {
    let rt = runtime();
    let mut p = pipeline(&rt, 2, Results::Copy);
    let other = rt.pool(8 << 20, PageSize::Base).expect("pool");
    let foreign = Stager::new(other, stage::Config::default()).expect("stager");
    let path = frame_file(&shm_dir(), "foreign", 2, 0);
    let file = File::open(&path, Direct::Off).expect("open");
    let mut source = FrameSource::new(foreign, file, FRAME).expect("source");
    let err = source.submit(&mut p).expect_err("not registered");
    assert!(
        matches!(
            err,
            userdma_infer::Error::Stage(Error::NotRegistered { .. })
        ),
        "{err}"
    );
    assert_eq!(p.in_flight(), 0, "the slot went back unused");
    // The same file through a stager over the pipeline's pool goes through.
    let (_, file) = source.into_parts();
    let mut source = FrameSource::new(stager(&p), file, FRAME).expect("source");
    assert_eq!(source.submit(&mut p).expect("frame"), Pull::Frame(0));
    p.shutdown(|_| {}).expect("shutdown");
    std::fs::remove_file(path).ok();
}

#[test]
fn misaligned_direct_frames_and_in_place_results_are_refused() {
    let rt = runtime();
    let dir = disk_dir();
    let path = frame_file(&dir, "misaligned", 2, 0);
    let p = pipeline(&rt, 1, Results::Copy);
    let file = File::open(&path, Direct::Require).expect("direct I/O on the build disk");
    let err = FrameSource::new(stager(&p), file.clone(), FRAME - 4).expect_err("misaligned");
    assert!(
        matches!(err, Error::Misaligned { what: "length", .. }),
        "{err}"
    );
    let err = FrameSource::new(stager(&p), file, 0).expect_err("empty frames");
    assert!(matches!(err, Error::Empty), "{err}");

    // A read-only file is no sink.
    let ro = File::open(&path, Direct::Off).expect("open");
    assert!(matches!(
        FrameSink::new(stager(&p), ro),
        Err(Error::ReadOnly { .. })
    ));

    // Results read in place from device memory have no host buffer to write from.
    drop(p);
    let mut p = pipeline(&rt, 1, Results::InPlace);
    let out = shm_dir().join(format!("inplace-{}", std::process::id()));
    std::fs::create_dir_all(shm_dir()).expect("dir");
    let mut sink =
        FrameSink::new(stager(&p), File::create(&out, Direct::Off).expect("create")).expect("sink");
    let mut source = FrameSource::new(
        stager(&p),
        File::open(&path, Direct::Off).expect("open"),
        FRAME,
    )
    .expect("source");
    let mut refused = 0;
    source
        .run(&mut p, |done| {
            let output = done.result.expect("no device error");
            assert!(output.in_place());
            match sink.write(&output) {
                Err(Error::InPlaceResult { .. }) => refused += 1,
                other => panic!("expected InPlaceResult, got {other:?}"),
            }
        })
        .expect("run");
    assert_eq!(refused, 2);
    assert_eq!(sink.written(), 0);
    std::fs::remove_file(path).ok();
    std::fs::remove_file(out).ok();
}
