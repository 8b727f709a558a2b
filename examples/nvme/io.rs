//! I/O: the write / read-and-verify loop on an I/O queue pair, each command's data in a pool
//! buffer (the commands and their PRPs are cut in `prp`, the data pattern is in `pattern`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::pool::{self, OwnedBuffer, Pool};
use userdma::ring::{self, Done, Queue, Rejected};

use crate::command::{nvm, Cqe, Sqe, Status};
use crate::pattern::pattern;
use crate::prp::{data_pointer, prp_entries, Chunk};
use crate::regs::PAGE;

/// The largest command this driver sends (also bounded by the controller's MDTS).
pub(crate) const MAX_CHUNK: usize = 64 << 10;

/// The byte a read buffer is filled with before the read, so that a read that moves nothing
/// cannot pass for one that moved the pattern.
const POISON: u8 = 0xa5;

/// SQ entries queued before the doorbell is rung.
const BATCH: u32 = 8;

/// The payload of a command in flight: the buffers it names, which the queue holds until the
/// completion hands them back, and what it was for.
#[derive(Debug, Default)]
pub(crate) struct Payload {
    /// The data buffer.
    pub(crate) data: Option<OwnedBuffer>,
    /// The PRP list, when the data spans more than two pages.
    pub(crate) list: Option<OwnedBuffer>,
    /// The blocks it transfers (I/O commands).
    pub(crate) chunk: Option<Chunk>,
}

/// A queue pair of this driver.
pub(crate) type NvmeQueue = Queue<Sqe, Cqe, Payload>;

/// What went wrong moving data.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The pool had no buffer.
    #[error("allocating a {len}-byte DMA buffer from the pool failed")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// The pool's error (boxed: it is large).
        #[source]
        source: Box<pool::Error>,
    },
    /// Copying to or from a buffer failed.
    #[error("{what} ({len} bytes at offset {offset}) failed")]
    Buffer {
        /// What was being copied.
        what: &'static str,
        /// Bytes.
        len: usize,
        /// Offset in the buffer.
        offset: usize,
        /// The pool's error (boxed: it is large).
        #[source]
        source: Box<pool::Error>,
    },
    /// A buffer not aligned to a page in IOVA space (PRP entries after the first must be).
    #[error("the pool gave a buffer at IOVA {iova:#x}, not {PAGE}-byte aligned: PRPs need page-aligned buffers (use a pool with a chunk size of at least 4 KiB)")]
    Unaligned {
        /// Its IOVA.
        iova: u64,
    },
    /// The buffer's pages have no IOVA, or need more PRP entries than one list page holds.
    #[error("cannot describe {len} bytes at offset {offset} of the buffer at IOVA {iova:#x} with PRPs (a page without an IOVA, or more than {} pages)", PAGE / 8 + 1)]
    Prp {
        /// Bytes.
        len: usize,
        /// Offset in the buffer.
        offset: usize,
        /// The buffer's IOVA.
        iova: u64,
    },
    /// A block count the command cannot carry.
    #[error("{blocks} blocks at LBA {lba} cannot be one command (1 to 65536 blocks)")]
    Count {
        /// The LBA.
        lba: u64,
        /// The count.
        blocks: u32,
    },
    /// The queue refused or failed.
    #[error("I/O queue: {what} failed")]
    Queue {
        /// What was being done.
        what: &'static str,
        /// The ring's error.
        #[source]
        source: ring::Error,
    },
    /// The controller failed a command.
    #[error("{op} of {blocks} blocks at LBA {lba} failed: {status}")]
    Command {
        /// The operation.
        op: &'static str,
        /// The LBA.
        lba: u64,
        /// The block count.
        blocks: u32,
        /// The controller's status.
        status: Status,
    },
    /// A completion came back without the payload a command was given (a driver bug).
    #[error("command {id} completed without its {what}: the driver lost track of it")]
    Lost {
        /// The command id.
        id: u16,
        /// What is missing.
        what: &'static str,
    },
    /// Data read back differs from the pattern.
    #[error("read back wrong data: {differ} bytes of {len} differ, the first in LBA {lba} at byte {byte} (want {want:#04x}, got {got:#04x}); seed {seed}")]
    Mismatch {
        /// The first LBA that differs.
        lba: u64,
        /// The byte within that block.
        byte: usize,
        /// The byte expected.
        want: u8,
        /// The byte read.
        got: u8,
        /// Bytes that differ in the command.
        differ: usize,
        /// Bytes compared.
        len: usize,
        /// The seed checked against.
        seed: u64,
    },
}

/// Which way data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Host to disk.
    Write,
    /// Disk to host (and checked against the pattern).
    Read,
}

impl Direction {
    fn opcode(self) -> u8 {
        match self {
            Direction::Write => nvm::WRITE,
            Direction::Read => nvm::READ,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Direction::Write => "write",
            Direction::Read => "read",
        }
    }
}

/// What a run of commands did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Report {
    /// Commands completed.
    pub(crate) commands: u64,
    /// Blocks moved.
    pub(crate) blocks: u64,
    /// Bytes moved.
    pub(crate) bytes: u64,
    /// Commands that needed a PRP list.
    pub(crate) prp_lists: u64,
    /// Commands whose data started inside a page.
    pub(crate) in_page: u64,
    /// Time from the first submission to the last completion.
    pub(crate) elapsed: Duration,
}

impl Report {
    /// MiB per second.
    pub(crate) fn mib_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.bytes as f64 / (1024.0 * 1024.0) / secs
    }

    /// Commands per second.
    pub(crate) fn iops(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.commands as f64 / secs
    }
}

/// The I/O side of the driver: one queue pair, the pool its buffers come from, the namespace.
#[derive(Debug)]
pub(crate) struct Io {
    /// The I/O queue pair.
    pub(crate) queue: NvmeQueue,
    /// Where buffers come from.
    pub(crate) pool: Arc<Pool>,
    /// The namespace.
    pub(crate) nsid: u32,
    /// Its LBA size.
    pub(crate) lba_size: u32,
    /// How long one command may take.
    pub(crate) timeout: Duration,
}

impl Io {
    /// Allocates a page-aligned buffer of at least `len` bytes.
    fn buffer(&self, len: usize) -> Result<OwnedBuffer, Error> {
        let len = len.max(PAGE);
        let buffer = self.pool.alloc_owned(len).map_err(|source| Error::Alloc {
            len,
            source: Box::new(source),
        })?;
        let iova = buffer.iova().raw();
        if iova % PAGE as u64 != 0 {
            return Err(Error::Unaligned { iova });
        }
        Ok(buffer)
    }

    /// The command for `chunk`, with its buffers filled (the pattern for a write, poison for
    /// a read).
    fn prepare(
        &self,
        direction: Direction,
        seed: u64,
        chunk: Chunk,
        report: &mut Report,
    ) -> Result<(Sqe, Payload), Error> {
        let len = chunk.blocks as usize * self.lba_size as usize;
        let data = self.buffer(chunk.offset + len)?;
        match direction {
            Direction::Write => {
                let bytes = pattern(seed, chunk.lba, chunk.blocks, self.lba_size);
                data.write(chunk.offset, &bytes)
            }
            Direction::Read => data.write(0, &vec![POISON; chunk.offset + len]),
        }
        .map_err(|source| Error::Buffer {
            what: "filling the data buffer",
            len,
            offset: chunk.offset,
            source: Box::new(source),
        })?;
        let prp_error = || Error::Prp {
            len,
            offset: chunk.offset,
            iova: data.iova().raw(),
        };
        let entries = prp_entries(chunk.offset, len, |page| {
            data.iova_at(page * PAGE).map(|iova| iova.raw())
        })
        .ok_or_else(prp_error)?;
        let list = if entries.len() > 2 {
            Some(self.buffer(PAGE)?)
        } else {
            None
        };
        if chunk.offset % PAGE != 0 {
            report.in_page += 1;
        }
        let pointer = data_pointer(&entries, list.as_ref()).ok_or_else(prp_error)??;
        let sqe = Sqe::rw(
            direction.opcode(),
            self.nsid,
            chunk.lba,
            chunk.blocks,
            pointer,
        )
        .ok_or(Error::Count {
            lba: chunk.lba,
            blocks: chunk.blocks,
        })?;
        Ok((
            sqe,
            Payload {
                data: Some(data),
                list,
                chunk: Some(chunk),
            },
        ))
    }

    /// Checks a completion: its status, and for a read the data against the pattern.
    fn complete(
        &self,
        direction: Direction,
        seed: u64,
        done: Done<Cqe, Payload>,
        report: &mut Report,
    ) -> Result<(), Error> {
        let Done { id, entry, payload } = done;
        let chunk = payload.chunk.ok_or(Error::Lost {
            id,
            what: "block range",
        })?;
        let status = entry.status();
        if !status.is_success() {
            return Err(Error::Command {
                op: direction.name(),
                lba: chunk.lba,
                blocks: chunk.blocks,
                status,
            });
        }
        let len = chunk.blocks as usize * self.lba_size as usize;
        // The PRP list came back with the data: the controller is done reading it too.
        if payload.list.is_some() {
            report.prp_lists += 1;
        }
        if direction == Direction::Read {
            let data = payload.data.as_ref().ok_or(Error::Lost {
                id,
                what: "data buffer",
            })?;
            let mut got = vec![0; len];
            data.read(chunk.offset, &mut got)
                .map_err(|source| Error::Buffer {
                    what: "reading the data buffer",
                    len,
                    offset: chunk.offset,
                    source: Box::new(source),
                })?;
            let want = pattern(seed, chunk.lba, chunk.blocks, self.lba_size);
            check(&want, &got, chunk.lba, self.lba_size, seed)?;
        }
        report.commands += 1;
        report.blocks += u64::from(chunk.blocks);
        report.bytes += len as u64;
        Ok(())
    }

    /// Waits for one completion and checks it.
    fn reap_one(
        &mut self,
        direction: Direction,
        seed: u64,
        report: &mut Report,
    ) -> Result<(), Error> {
        let done = self
            .queue
            .wait(Some(self.timeout))
            .map_err(|source| Error::Queue {
                what: "waiting for a completion",
                source,
            })?;
        self.complete(direction, seed, done, report)
    }

    /// Moves `chunks` in `direction`, up to a queue's worth in flight, a doorbell per batch.
    /// Reads are checked against the pattern of `seed`.
    pub(crate) fn run(
        &mut self,
        direction: Direction,
        seed: u64,
        chunks: &[Chunk],
    ) -> Result<Report, Error> {
        let mut report = Report::default();
        let start = Instant::now();
        for &chunk in chunks {
            let (mut sqe, mut payload) = self.prepare(direction, seed, chunk, &mut report)?;
            loop {
                match self.queue.push(sqe, payload) {
                    Ok(_) => break,
                    Err(Rejected {
                        error: ring::Error::Full { .. } | ring::Error::NoCommandId { .. },
                        descriptor,
                        payload: given,
                    }) => {
                        // No room: announce what is queued and take a completion.
                        (sqe, payload) = (descriptor, given);
                        self.flush()?;
                        self.reap_one(direction, seed, &mut report)?;
                    }
                    Err(rejected) => {
                        return Err(Error::Queue {
                            what: "queueing a command",
                            source: rejected.error,
                        })
                    }
                }
            }
            if self.queue.unflushed() >= BATCH {
                self.flush()?;
            }
        }
        self.flush()?;
        while self.queue.in_flight() > 0 {
            self.reap_one(direction, seed, &mut report)?;
        }
        report.elapsed = start.elapsed();
        Ok(report)
    }

    fn flush(&mut self) -> Result<(), Error> {
        self.queue.flush().map_err(|source| Error::Queue {
            what: "ringing the SQ doorbell",
            source,
        })
    }

    /// Flushes the namespace's volatile write cache to the medium.
    pub(crate) fn flush_cache(&mut self) -> Result<(), Error> {
        self.queue
            .submit(Sqe::flush(self.nsid), Payload::default())
            .map_err(|source| Error::Queue {
                what: "submitting Flush",
                source,
            })?;
        let done = self
            .queue
            .wait(Some(self.timeout))
            .map_err(|source| Error::Queue {
                what: "waiting for Flush",
                source,
            })?;
        let status = done.entry.status();
        if !status.is_success() {
            return Err(Error::Command {
                op: "flush",
                lba: 0,
                blocks: 0,
                status,
            });
        }
        Ok(())
    }
}

/// Compares a read with the pattern.
fn check(want: &[u8], got: &[u8], lba: u64, lba_size: u32, seed: u64) -> Result<(), Error> {
    if want == got {
        return Ok(());
    }
    let differ = want.iter().zip(got).filter(|(a, b)| a != b).count();
    let first = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let size = lba_size as usize;
    Err(Error::Mismatch {
        lba: lba + (first / size) as u64,
        byte: first % size,
        want: want.get(first).copied().unwrap_or(0),
        got: got.get(first).copied().unwrap_or(0),
        differ: differ.max(1),
        len: want.len(),
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_first_bad_block() {
        let want = pattern(3, 100, 4, 512);
        assert!(check(&want, &want, 100, 512, 3).is_ok());
        let mut got = want.clone();
        got[512 * 2 + 7] ^= 0xff;
        got[512 * 3] ^= 1;
        match check(&want, &got, 100, 512, 3) {
            Err(Error::Mismatch {
                lba, byte, differ, ..
            }) => assert_eq!((lba, byte, differ), (102, 7, 2)),
            other => panic!("want a mismatch, got {other:?}"),
        }
    }
}
