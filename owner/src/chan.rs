//! The rings between a client and the owner, in one shared-memory region the owner makes
//! and sends: a submission ring (client → owner: frames to run) and a completion ring
//! (owner → client: frames done), each single-producer single-consumer, and two idle flags
//! that let either side sleep on a doorbell (an eventfd) that the other rings only when it
//! is idle: no system call per frame while both are busy.
//!
//! ```text
//!   word  0      magic "udmachan", version, SQ entries, CQ entries
//!   word  8      SQ tail     (client writes)       each on its own cache line
//!   word 16      SQ head     (owner writes)
//!   word 24      CQ tail     (owner writes)
//!   word 32      CQ head     (client writes)
//!   word 40      owner idle  (owner writes)
//!   word 48      client idle (client writes)
//!   word 64      SQ entries, 4 words each: stream | flags, input offset, result offset, tag
//!   then         CQ entries, 4 words each: stream | status, tag, latency ns, wait ns
//! ```
//!
//! Every word is an `AtomicU64`, so either side reads whatever the other wrote without a
//! data race, whatever the other process does. The owner never trusts what a client writes:
//! it keeps its own SQ head and CQ tail (a client overwriting them changes nothing) and
//! checks the client's SQ tail and CQ head against them ([`Error::Corrupt`]: the owner closes
//! that client).
//!
//! **Orderings.** A producer writes an entry's words (Relaxed) and then its tail (Release); the
//! consumer loads the tail (Acquire) before the entry's words, so it sees them whole. A
//! consumer publishes its head with Release after reading the entries, and the producer loads
//! it with Acquire before reusing their slots, so an entry is never overwritten while read.
//! **Sleeping** is Dekker's pattern: the sleeper stores its idle flag, a SeqCst fence, then
//! looks at the ring once more before it sleeps; the producer publishes its entry, a SeqCst
//! fence, then loads the flag and rings the doorbell if it is set. The two fences order the
//! store before the load on each side, so at least one of them sees the other's write: either
//! the sleeper finds the entry or the producer rings (checked by the loom test).

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// "udmachan", little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"udmachan");
/// The rings' layout version.
pub const VERSION: u64 = 1;
/// The most entries a ring has.
pub const MAX_ENTRIES: u32 = 1 << 16;

const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_SQ_ENTRIES: usize = 2;
const W_CQ_ENTRIES: usize = 3;
const W_SQ_TAIL: usize = 8;
const W_SQ_HEAD: usize = 16;
const W_CQ_TAIL: usize = 24;
const W_CQ_HEAD: usize = 32;
const W_OWNER_IDLE: usize = 40;
const W_CLIENT_IDLE: usize = 48;
const W_ENTRIES: usize = 64;
const ENTRY_WORDS: usize = 4;

/// A completion's status: the frame ran; its result is in the result buffer.
pub const STATUS_OK: u32 = 0;
/// The device failed the frame.
pub const STATUS_FAILED: u32 = 1;
/// The frame was in flight when the device was reset (or its reset failed): submit it again.
pub const STATUS_LOST: u32 = 2;
/// The submission was refused and nothing was read or written (the tag says which): by the
/// owner, for a stream not the client's, or a span outside the client's pool, misaligned or
/// not contiguous for the device; or by the client before sending it, for a buffer too short
/// for the model or one it did not allocate ([`crate::Client::submit_spans`]).
pub const STATUS_REFUSED: u32 = 3;
/// The device was removed.
pub const STATUS_REMOVED: u32 = 4;
/// The stream was closed before the frame ran.
pub const STATUS_CLOSED: u32 = 5;

/// The name of a status, for messages.
pub fn status_name(status: u32) -> &'static str {
    match status {
        STATUS_OK => "ok",
        STATUS_FAILED => "failed on the device",
        STATUS_LOST => "lost to a device reset",
        STATUS_REFUSED => {
            "refused (unknown stream, or a buffer outside the pool, not allocated or too short)"
        }
        STATUS_REMOVED => "the device was removed",
        STATUS_CLOSED => "its stream was closed",
        _ => "unknown status",
    }
}

/// A frame to run: a stream of the client's, its input and result buffers as offsets in the
/// client's pool region, and a tag the completion carries back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Submission {
    /// The stream (as [`crate::proto::Msg::Declared`] numbered it).
    pub stream: u32,
    /// The input buffer's offset in the pool's region.
    pub input: u64,
    /// The result buffer's offset in the pool's region.
    pub result: u64,
    /// The client's own tag.
    pub tag: u64,
}

/// A frame done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The stream.
    pub stream: u32,
    /// [`STATUS_OK`] or why not.
    pub status: u32,
    /// The submission's tag.
    pub tag: u64,
    /// From the owner taking the frame to its completion, ns.
    pub latency_ns: u64,
    /// From the owner taking the frame to its dispatch to the device, ns.
    pub wait_ns: u64,
}

/// Why the rings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A region that is not the rings (or of another version, or too short).
    #[error("not the owner's rings: {why}")]
    Layout {
        /// What was wrong.
        why: &'static str,
    },
    /// The peer wrote an index no correct peer could.
    #[error(
        "the client's {ring} index is {found}, where {low} to {high} are possible: it wrote \
         its rings' indices wrongly (the owner closes it)"
    )]
    Corrupt {
        /// "submission" or "completion".
        ring: &'static str,
        /// What it wrote.
        found: u64,
        /// The least possible.
        low: u64,
        /// The most possible.
        high: u64,
    },
}

/// The bytes of rings of `sq` and `cq` entries.
pub fn region_len(sq: u32, cq: u32) -> usize {
    (W_ENTRIES + ENTRY_WORDS * (sq as usize + cq as usize)) * 8
}

/// A view of the rings over shared words.
#[derive(Debug, Clone, Copy)]
pub struct Rings<'a> {
    words: &'a [AtomicU64],
    sq: u64,
    cq: u64,
}

impl<'a> Rings<'a> {
    /// Lays out fresh rings of `sq` and `cq` entries (powers of two, at most
    /// [`MAX_ENTRIES`]) over `words` (the owner, on a region no client has yet).
    ///
    /// # Errors
    /// [`Error::Layout`] for sizes that are not powers of two or words too few.
    pub fn init(words: &'a [AtomicU64], sq: u32, cq: u32) -> Result<Rings<'a>, Error> {
        check_sizes(u64::from(sq), u64::from(cq), words.len())?;
        for w in words.iter().take(W_ENTRIES) {
            w.store(0, Ordering::Relaxed);
        }
        words[W_VERSION].store(VERSION, Ordering::Relaxed);
        words[W_SQ_ENTRIES].store(u64::from(sq), Ordering::Relaxed);
        words[W_CQ_ENTRIES].store(u64::from(cq), Ordering::Relaxed);
        // Release: a client that loads the magic with Acquire sees the rest of the header.
        words[W_MAGIC].store(MAGIC, Ordering::Release);
        Ok(Rings {
            words,
            sq: u64::from(sq),
            cq: u64::from(cq),
        })
    }

    /// The rings the owner laid out over `words` (a client, on the region it received).
    ///
    /// # Errors
    /// [`Error::Layout`] for anything but rings of this version that fit.
    pub fn open(words: &'a [AtomicU64]) -> Result<Rings<'a>, Error> {
        if words.len() < W_ENTRIES {
            return Err(Error::Layout {
                why: "shorter than the rings' header",
            });
        }
        // Acquire: pairs with the Release store of the magic in `init`.
        if words[W_MAGIC].load(Ordering::Acquire) != MAGIC {
            return Err(Error::Layout { why: "no magic" });
        }
        if words[W_VERSION].load(Ordering::Relaxed) != VERSION {
            return Err(Error::Layout {
                why: "another layout version",
            });
        }
        let sq = words[W_SQ_ENTRIES].load(Ordering::Relaxed);
        let cq = words[W_CQ_ENTRIES].load(Ordering::Relaxed);
        check_sizes(sq, cq, words.len())?;
        Ok(Rings { words, sq, cq })
    }

    /// The rings over `words` with the sizes the owner laid out ([`Rings::init`]), without
    /// reading the header a client could have overwritten.
    ///
    /// # Panics
    /// If `words` is shorter than such rings (the owner's own bug).
    pub fn trusted(words: &'a [AtomicU64], sq: u32, cq: u32) -> Rings<'a> {
        assert!(check_sizes(u64::from(sq), u64::from(cq), words.len()).is_ok());
        Rings {
            words,
            sq: u64::from(sq),
            cq: u64::from(cq),
        }
    }

    /// Submission ring entries.
    pub fn sq_entries(&self) -> u32 {
        self.sq as u32
    }

    /// Completion ring entries.
    pub fn cq_entries(&self) -> u32 {
        self.cq as u32
    }

    fn sq_entry(&self, index: u64) -> &'a [AtomicU64] {
        let at = W_ENTRIES + ENTRY_WORDS * (index & (self.sq - 1)) as usize;
        &self.words[at..at + ENTRY_WORDS]
    }

    fn cq_entry(&self, index: u64) -> &'a [AtomicU64] {
        let at = W_ENTRIES + ENTRY_WORDS * (self.sq as usize + (index & (self.cq - 1)) as usize);
        &self.words[at..at + ENTRY_WORDS]
    }

    // ---- the client's side ----

    /// Client: queues `s`; `false` when the ring is full (take completions first).
    pub fn submit(&self, s: &Submission) -> bool {
        // Relaxed: only this side writes the tail.
        let tail = self.words[W_SQ_TAIL].load(Ordering::Relaxed);
        // Acquire: the owner's reads of the entries it consumed happened before.
        let head = self.words[W_SQ_HEAD].load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= self.sq {
            return false;
        }
        let e = self.sq_entry(tail);
        e[0].store(u64::from(s.stream), Ordering::Relaxed);
        e[1].store(s.input, Ordering::Relaxed);
        e[2].store(s.result, Ordering::Relaxed);
        e[3].store(s.tag, Ordering::Relaxed);
        // Release: publishes the entry's words with the tail.
        self.words[W_SQ_TAIL].store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Client: after submitting, whether the owner is idle and must be woken (its doorbell
    /// rung). See the module docs for the fence.
    pub fn owner_needs_wake(&self) -> bool {
        // SeqCst fence: orders the tail store above before this load (Dekker).
        fence(Ordering::SeqCst);
        self.words[W_OWNER_IDLE].load(Ordering::Relaxed) != 0
    }

    /// Client: takes one completion.
    pub fn complete(&self) -> Option<Completion> {
        let head = self.words[W_CQ_HEAD].load(Ordering::Relaxed);
        // Acquire: pairs with the owner's Release store of the tail; the entry is whole.
        let tail = self.words[W_CQ_TAIL].load(Ordering::Acquire);
        if tail == head {
            return None;
        }
        let e = self.cq_entry(head);
        let w0 = e[0].load(Ordering::Relaxed);
        let c = Completion {
            stream: w0 as u32,
            status: (w0 >> 32) as u32,
            tag: e[1].load(Ordering::Relaxed),
            latency_ns: e[2].load(Ordering::Relaxed),
            wait_ns: e[3].load(Ordering::Relaxed),
        };
        // Release: the entry was read before the owner may reuse its slot.
        self.words[W_CQ_HEAD].store(head.wrapping_add(1), Ordering::Release);
        Some(c)
    }

    /// Client: whether a completion is waiting (without taking it).
    pub fn completions_waiting(&self) -> bool {
        let head = self.words[W_CQ_HEAD].load(Ordering::Relaxed);
        // Relaxed: a hint; `complete` loads the tail with Acquire before reading the entry.
        self.words[W_CQ_TAIL].load(Ordering::Relaxed) != head
    }

    /// Client: marks itself idle before sleeping on its doorbell; returns whether a
    /// completion is already there (then it must not sleep: call [`Rings::client_awake`]).
    pub fn client_idle(&self) -> bool {
        self.words[W_CLIENT_IDLE].store(1, Ordering::Relaxed);
        // SeqCst fence: orders the flag's store before the tail's load (Dekker).
        fence(Ordering::SeqCst);
        let head = self.words[W_CQ_HEAD].load(Ordering::Relaxed);
        self.words[W_CQ_TAIL].load(Ordering::Acquire) != head
    }

    /// Client: awake again.
    pub fn client_awake(&self) {
        self.words[W_CLIENT_IDLE].store(0, Ordering::Relaxed);
    }

    // ---- the owner's side ----

    /// Owner: the submissions waiting, given its own `head`; checks the client's tail.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a tail no client could have written.
    pub fn submissions(&self, head: u64) -> Result<u64, Error> {
        // Acquire: pairs with the client's Release store of the tail.
        let tail = self.words[W_SQ_TAIL].load(Ordering::Acquire);
        let waiting = tail.wrapping_sub(head);
        if waiting > self.sq {
            return Err(Error::Corrupt {
                ring: "submission",
                found: tail,
                low: head,
                high: head.wrapping_add(self.sq),
            });
        }
        Ok(waiting)
    }

    /// Owner: whether a submission is waiting past its `head` (a hint, for spinning:
    /// [`Rings::submissions`] checks the tail).
    pub fn submission_waiting(&self, head: u64) -> bool {
        // Relaxed: a hint; `submissions` loads the tail with Acquire before the entries.
        self.words[W_SQ_TAIL].load(Ordering::Relaxed) != head
    }

    /// Owner: reads the submission at `index` (below the tail [`Rings::submissions`] saw).
    pub fn read_submission(&self, index: u64) -> Submission {
        let e = self.sq_entry(index);
        let w0 = e[0].load(Ordering::Relaxed);
        Submission {
            stream: w0 as u32,
            input: e[1].load(Ordering::Relaxed),
            result: e[2].load(Ordering::Relaxed),
            tag: e[3].load(Ordering::Relaxed),
        }
    }

    /// Owner: gives the slots below `head` back to the client.
    pub fn consumed(&self, head: u64) {
        // Release: the entries were read before the client may overwrite them.
        self.words[W_SQ_HEAD].store(head, Ordering::Release);
    }

    /// Owner: room in the completion ring, given its own `tail`; checks the client's head.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a head no client could have written.
    pub fn completion_room(&self, tail: u64) -> Result<u64, Error> {
        // Acquire: the client read the entries below its head before publishing it.
        let head = self.words[W_CQ_HEAD].load(Ordering::Acquire);
        let used = tail.wrapping_sub(head);
        if used > self.cq {
            return Err(Error::Corrupt {
                ring: "completion",
                found: head,
                low: tail.wrapping_sub(self.cq),
                high: tail,
            });
        }
        Ok(self.cq - used)
    }

    /// Owner: writes `c` at `tail` (room checked with [`Rings::completion_room`]) and
    /// publishes it; returns the new tail.
    pub fn post(&self, tail: u64, c: &Completion) -> u64 {
        let e = self.cq_entry(tail);
        e[0].store(
            u64::from(c.stream) | (u64::from(c.status) << 32),
            Ordering::Relaxed,
        );
        e[1].store(c.tag, Ordering::Relaxed);
        e[2].store(c.latency_ns, Ordering::Relaxed);
        e[3].store(c.wait_ns, Ordering::Relaxed);
        let tail = tail.wrapping_add(1);
        // Release: publishes the entry's words with the tail.
        self.words[W_CQ_TAIL].store(tail, Ordering::Release);
        tail
    }

    /// Owner: after posting, whether the client sleeps and must be woken.
    pub fn client_needs_wake(&self) -> bool {
        // SeqCst fence: orders the tail store before this load (Dekker).
        fence(Ordering::SeqCst);
        self.words[W_CLIENT_IDLE].load(Ordering::Relaxed) != 0
    }

    /// Owner: marks itself idle before sleeping; returns whether a submission came meanwhile
    /// (given its `head`).
    pub fn owner_idle(&self, head: u64) -> bool {
        self.words[W_OWNER_IDLE].store(1, Ordering::Relaxed);
        // SeqCst fence: orders the flag's store before the tail's load (Dekker).
        fence(Ordering::SeqCst);
        self.words[W_SQ_TAIL].load(Ordering::Acquire) != head
    }

    /// Owner: awake again.
    pub fn owner_awake(&self) {
        self.words[W_OWNER_IDLE].store(0, Ordering::Relaxed);
    }
}

fn check_sizes(sq: u64, cq: u64, words: usize) -> Result<(), Error> {
    let ok = |n: u64| n.is_power_of_two() && n <= u64::from(MAX_ENTRIES);
    if !ok(sq) || !ok(cq) {
        return Err(Error::Layout {
            why: "ring entries must be powers of two up to 65536",
        });
    }
    if W_ENTRIES + ENTRY_WORDS * (sq + cq) as usize > words {
        return Err(Error::Layout {
            why: "the region is shorter than its rings",
        });
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn words(n: usize) -> Vec<AtomicU64> {
        (0..n).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn frames_go_round_in_order_and_full_rings_refuse() {
        let w = words(region_len(4, 4) / 8);
        let owner = Rings::init(&w, 4, 4).unwrap();
        let client = Rings::open(&w).unwrap();
        for i in 0..4 {
            assert!(client.submit(&Submission {
                stream: i,
                input: 4096 * u64::from(i),
                result: 1,
                tag: 100 + u64::from(i),
            }));
        }
        assert!(!client.submit(&Submission::default()), "full");
        let mut head = 0;
        assert_eq!(owner.submissions(head).unwrap(), 4);
        for i in 0..4 {
            let s = owner.read_submission(head);
            assert_eq!((s.stream, s.tag), (i, 100 + u64::from(i)));
            head += 1;
        }
        owner.consumed(head);
        assert!(client.submit(&Submission::default()), "room again");
        let mut tail = 0;
        assert_eq!(owner.completion_room(tail).unwrap(), 4);
        for i in 0..4 {
            tail = owner.post(
                tail,
                &Completion {
                    stream: i,
                    status: STATUS_LOST,
                    tag: u64::from(i),
                    latency_ns: 5,
                    wait_ns: 1,
                },
            );
        }
        assert_eq!(owner.completion_room(tail).unwrap(), 0);
        for i in 0..4 {
            let c = client.complete().unwrap();
            assert_eq!((c.stream, c.status, c.tag), (i, STATUS_LOST, u64::from(i)));
        }
        assert_eq!(client.complete(), None);
    }

    #[test]
    fn indices_no_client_could_write_are_caught() {
        let w = words(region_len(8, 8) / 8);
        let owner = Rings::init(&w, 8, 8).unwrap();
        w[W_SQ_TAIL].store(9, Ordering::Relaxed);
        assert!(matches!(owner.submissions(0), Err(Error::Corrupt { .. })));
        w[W_SQ_TAIL].store(u64::MAX, Ordering::Relaxed);
        assert!(matches!(owner.submissions(0), Err(Error::Corrupt { .. })));
        w[W_CQ_HEAD].store(3, Ordering::Relaxed); // ahead of the tail
        assert!(matches!(
            owner.completion_room(0),
            Err(Error::Corrupt { .. })
        ));
        // A client overwriting the owner's head changes nothing: the owner keeps its own.
        w[W_SQ_TAIL].store(2, Ordering::Relaxed);
        w[W_SQ_HEAD].store(1000, Ordering::Relaxed);
        assert_eq!(owner.submissions(0).unwrap(), 2);
    }

    #[test]
    fn layouts_that_are_not_rings_are_refused() {
        let w = words(64);
        assert!(Rings::open(&w).is_err());
        assert!(Rings::init(&w, 3, 4).is_err());
        assert!(Rings::init(&w, 4, 4).is_err(), "too few words");
        let w = words(region_len(4, 4) / 8);
        Rings::init(&w, 4, 4).unwrap();
        w[W_CQ_ENTRIES].store(1 << 20, Ordering::Relaxed);
        assert!(Rings::open(&w).is_err());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Dekker: a submission published while the owner goes idle is either seen by the owner's
    /// last look or rings its doorbell; never neither.
    #[test]
    fn no_wake_up_is_lost() {
        loom::model(|| {
            let w: Arc<Vec<AtomicU64>> = Arc::new(
                (0..region_len(2, 2) / 8)
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            );
            Rings::init(&w, 2, 2).unwrap();
            let w2 = Arc::clone(&w);
            let client = loom::thread::spawn(move || {
                let r = Rings::open(&w2).unwrap();
                assert!(r.submit(&Submission {
                    stream: 1,
                    input: 2,
                    result: 3,
                    tag: 4,
                }));
                r.owner_needs_wake()
            });
            let r = Rings::open(&w).unwrap();
            let saw = r.owner_idle(0);
            let rang = client.join().unwrap();
            assert!(saw || rang, "lost wake-up");
            if saw {
                assert_eq!(r.submissions(0).unwrap(), 1);
                assert_eq!(r.read_submission(0).tag, 4, "the entry is whole");
            }
        });
    }

    /// The completion side: the client going idle either sees the completion or is woken.
    #[test]
    fn no_completion_wake_up_is_lost() {
        loom::model(|| {
            let w: Arc<Vec<AtomicU64>> = Arc::new(
                (0..region_len(2, 2) / 8)
                    .map(|_| AtomicU64::new(0))
                    .collect(),
            );
            Rings::init(&w, 2, 2).unwrap();
            let w2 = Arc::clone(&w);
            let owner = loom::thread::spawn(move || {
                let r = Rings::open(&w2).unwrap();
                assert_eq!(r.completion_room(0).unwrap(), 2);
                r.post(
                    0,
                    &Completion {
                        tag: 9,
                        ..Completion::default()
                    },
                );
                r.client_needs_wake()
            });
            let r = Rings::open(&w).unwrap();
            let saw = r.client_idle();
            let rang = owner.join().unwrap();
            assert!(saw || rang, "lost wake-up");
            if saw {
                assert_eq!(r.complete().unwrap().tag, 9);
            }
        });
    }
}
