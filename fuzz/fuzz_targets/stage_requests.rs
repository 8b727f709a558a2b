//! The stager against a model: sequences of reads (sizes, offsets, zero lengths, past the end),
//! reads from a pipe that stay in flight until written or cancelled, cancellations, waits and
//! polls, then a drop with whatever is still in flight. The file is on tmpfs (the buffered
//! path); the direct path's alignment rule is checked separately against the model's
//! arithmetic. After every completion: the ticket was in flight, the buffer is the one given,
//! the bytes equal the model's (the file's pattern, `min(len, size - offset)` of them), a
//! cancelled read either was cancelled or read correctly, and nothing is in flight that the
//! model does not know of.

#![no_main]

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Config, Pool};
use userdma_infer::stage::{self, Alignment, Completion, Direct, Error, File, Stager};

const FILE_LEN: u64 = 256 << 10;

#[derive(Debug, Arbitrary)]
struct Input {
    depth: u8,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Read {
        offset: u32,
        len: u16,
    },
    ReadPipe {
        len: u16,
    },
    WritePipe {
        len: u8,
    },
    Cancel(u8),
    Wait,
    Poll,
    Align {
        offset: u32,
        len: u32,
        addr: u32,
        memory: u8,
        off: u8,
    },
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 13) as u8
}

struct Fixture {
    pool: Arc<Pool>,
    file: File,
    pipe_path: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let region = Region::builder(4 << 20)
            .page_size(PageSize::Base)
            .lock(false)
            .build()
            .expect("4 MiB region");
        let mapping = SoftIommu::new(48)
            .expect("space")
            .map(Arc::new(region))
            .expect("map");
        let pool = Arc::new(Pool::new(mapping, Config::default()).expect("pool"));
        let dir = PathBuf::from("/dev/shm");
        let path = dir.join(format!("userdma-fuzz-stage-{}", std::process::id()));
        let data: Vec<u8> = (0..FILE_LEN).map(pattern).collect();
        std::fs::write(&path, data).expect("tmpfs file");
        let file = File::open(&path, Direct::Prefer).expect("open");
        let pipe_path = dir.join(format!("userdma-fuzz-stage-pipe-{}", std::process::id()));
        let _ = std::fs::remove_file(&pipe_path);
        let c = std::ffi::CString::new(pipe_path.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        Fixture {
            pool,
            file,
            pipe_path,
        }
    })
}

/// What the model knows of a request in flight.
struct Expect {
    offset: u64,
    len: usize,
    pipe: bool,
    cancelled: bool,
    addr: usize,
}

fn check(done: &Completion, expect: &Expect, pipe_bytes: &mut u64) {
    assert_eq!(
        done.buffer.as_ptr().as_ptr() as usize,
        expect.addr,
        "its own buffer back"
    );
    match &done.result {
        Err(Error::Cancelled { .. }) => assert!(expect.cancelled, "cancelled unasked"),
        Err(e) => panic!("read failed: {e}"),
        Ok(t) => {
            assert_eq!(t.requested, expect.len);
            assert_eq!(done.buffer.len(), t.bytes);
            if expect.pipe {
                assert!(t.bytes <= expect.len && t.bytes as u64 <= *pipe_bytes);
                *pipe_bytes -= t.bytes as u64;
            } else {
                let want = FILE_LEN
                    .saturating_sub(expect.offset)
                    .min(expect.len as u64);
                assert_eq!(t.bytes as u64, want, "bytes at {:#x}", expect.offset);
                let mut got = vec![0u8; t.bytes];
                done.buffer.read(0, &mut got).expect("read back");
                for (i, b) in got.iter().enumerate() {
                    assert_eq!(*b, pattern(expect.offset + i as u64));
                }
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let fx = fixture();
    let depth = u32::from(input.depth % 16) + 1;
    let mut stager =
        Stager::new(fx.pool.clone(), stage::Config::default().depth(depth)).expect("stager");
    // The writer first, read-write, so neither open waits for the other side.
    let mut writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fx.pipe_path)
        .expect("pipe writer");
    let pipe = File::open(&fx.pipe_path, Direct::Off).expect("pipe reader");
    let mut model: HashMap<stage::Ticket, Expect> = HashMap::new();
    let mut pipe_bytes = 0u64;
    let mut order = Vec::new();
    for op in input.ops.into_iter().take(200) {
        match op {
            Op::Read { offset, len } => {
                let offset = u64::from(offset) % (FILE_LEN + 8192);
                let Ok(mut buffer) = fx.pool.alloc_owned(usize::from(len).max(1)) else {
                    continue;
                };
                buffer.set_len(usize::from(len)).expect("len");
                let addr = buffer.as_ptr().as_ptr() as usize;
                match stager.read(&fx.file, offset, buffer) {
                    Ok(t) => {
                        assert!(len > 0);
                        model.insert(
                            t,
                            Expect {
                                offset,
                                len: usize::from(len),
                                pipe: false,
                                cancelled: false,
                                addr,
                            },
                        );
                        order.push(t);
                    }
                    Err(r) => match r.error {
                        Error::Empty => assert_eq!(len, 0),
                        Error::Full { .. } => assert!(model.len() >= depth as usize),
                        e => panic!("refused: {e}"),
                    },
                }
            }
            Op::ReadPipe { len } => {
                let len = usize::from(len).max(1);
                let Ok(buffer) = fx.pool.alloc_owned(len) else {
                    continue;
                };
                let addr = buffer.as_ptr().as_ptr() as usize;
                match stager.read(&pipe, 0, buffer) {
                    Ok(t) => {
                        model.insert(
                            t,
                            Expect {
                                offset: 0,
                                len,
                                pipe: true,
                                cancelled: false,
                                addr,
                            },
                        );
                        order.push(t);
                    }
                    Err(r) => assert!(matches!(r.error, Error::Full { .. })),
                }
            }
            Op::WritePipe { len } => {
                writer
                    .write_all(&vec![7u8; usize::from(len)])
                    .expect("pipe write");
                pipe_bytes += u64::from(len);
            }
            Op::Cancel(i) => {
                if order.is_empty() {
                    continue;
                }
                let t = order[usize::from(i) % order.len()];
                // True only for a request the model has in flight (one reaped but not yet
                // taken is no longer cancellable, and reports false).
                let in_flight = stager.cancel(t).expect("cancel");
                assert!(!in_flight || model.contains_key(&t));
                if let Some(e) = model.get_mut(&t) {
                    e.cancelled |= in_flight;
                }
            }
            Op::Wait => {
                // A pipe read may wait forever: only wait when a file read is in flight.
                if !model.values().any(|e| !e.pipe || e.cancelled) {
                    continue;
                }
                let done = stager.wait().expect("wait");
                let e = model.remove(&done.ticket).expect("a ticket in flight");
                check(&done, &e, &mut pipe_bytes);
            }
            Op::Poll => {
                while let Some(done) = stager.try_wait().expect("poll") {
                    let e = model.remove(&done.ticket).expect("a ticket in flight");
                    check(&done, &e, &mut pipe_bytes);
                }
            }
            Op::Align {
                offset,
                len,
                addr,
                memory,
                off,
            } => {
                let a = Alignment {
                    memory: 1 << (memory % 13),
                    offset: 1 << (off % 13),
                };
                let (o, l, m) = (u64::from(offset), len as usize, addr as usize);
                let model = if o % u64::from(a.offset) != 0 {
                    Some(("file offset", o, a.offset))
                } else if l % a.offset as usize != 0 {
                    Some(("length", l as u64, a.offset))
                } else if m % a.memory as usize != 0 {
                    Some(("buffer address", m as u64, a.memory))
                } else {
                    None
                };
                assert_eq!(a.check(o, l, m), model);
            }
        }
        assert_eq!(
            stager.in_flight(),
            model.len(),
            "in flight as the model says"
        );
    }
    // Dropping with reads in flight (pipe reads never written to among them) cancels them
    // and waits: it must return, and the buffers go back to the pool.
    drop(stager);
    // Closing both ends discards what is left in the pipe.
    drop((pipe, writer));
    assert_eq!(userdma::pool::leaked_mappings(), 0);
});
