//! A software NVMe controller for the driver's tests: BAR0 in shared memory, queues and data in
//! a loopback DMA space, completions with phase tags and SQ heads, MSI-X as eventfds, one
//! namespace of 512-byte blocks on a `Vec`. It follows the specification where the driver
//! depends on it (CC.EN / CSTS.RDY, AQA/ASQ/ACQ, slot doorbells with the doorbell stride, PRP
//! lists, Create/Delete I/O queues, CC.SHN / CSTS.SHST) and checks what the driver gives it
//! (page-aligned queue bases, PRP entries after the first page aligned, IOVAs mapped), failing
//! a command with the status a controller would use.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use userdma::device::{self, Identity, Kind};
use userdma::dma::{Iova, SoftIommu, Space};
use userdma::irq::EventFd;
use userdma::mmio::{Block, DynBlock, Shared};

use crate::command::{Cqe, Sqe};
use crate::regs::PAGE;

mod commands;

/// Blocks in the namespace.
pub(crate) const BLOCKS: u64 = 2048;
/// Bytes per block.
pub(crate) const LBA_SIZE: usize = 512;
/// MSI-X vectors.
const VECTORS: usize = 2;
/// CAP: MQES 63, CQR, TO 1 (500 ms), DSTRD 0, CSS NVM, MPSMIN 0, MPSMAX 0.
const CAP: u64 = 63 | (1 << 16) | (1 << 24) | (1 << 37);

/// What the fake saw, for the tests to check.
#[derive(Debug, Default, Clone)]
pub(crate) struct Seen {
    /// Commands by (queue, opcode).
    pub(crate) commands: BTreeMap<(u16, u8), u32>,
    /// I/O commands whose data needed a PRP list.
    pub(crate) prp_lists: u32,
    /// I/O commands whose PRP1 had an offset in its page.
    pub(crate) in_page: u32,
    /// Controller enables.
    pub(crate) enables: u32,
    /// Normal shutdowns.
    pub(crate) shutdowns: u32,
    /// Commands failed, with their status field.
    pub(crate) failed: Vec<u16>,
}

/// How the fake misbehaves, for the tests that check the driver notices.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Faults {
    /// Flip one bit of the data of every read.
    pub(crate) corrupt_reads: bool,
    /// Complete reads successfully without moving any data.
    pub(crate) empty_reads: bool,
}

#[derive(Debug)]
struct Sq {
    base: u64,
    size: u32,
    head: u32,
    cqid: u16,
}

#[derive(Debug)]
struct Cq {
    base: u64,
    size: u32,
    tail: u32,
    phase: bool,
    vector: u16,
}

/// The controller's state, owned by its thread.
struct Device {
    bar: DynBlock,
    space: Arc<SoftIommu>,
    irqs: Vec<EventFd>,
    disk: Arc<Mutex<Vec<u8>>>,
    seen: Arc<Mutex<Seen>>,
    faults: Faults,
    enabled: bool,
    shut_down: bool,
    sqs: BTreeMap<u16, Sq>,
    cqs: BTreeMap<u16, Cq>,
}

/// A status field: (type, code).
type Status = (u8, u8);
const OK: Status = (0, 0);
const INVALID_OPCODE: Status = (0, 0x01);
const INVALID_FIELD: Status = (0, 0x02);
const DATA_TRANSFER: Status = (0, 0x04);
const INVALID_NAMESPACE: Status = (0, 0x0b);
const LBA_RANGE: Status = (0, 0x80);
const INVALID_CQ: Status = (1, 0x00);
const INVALID_QID: Status = (1, 0x01);
const INVALID_SIZE: Status = (1, 0x02);
const INVALID_VECTOR: Status = (1, 0x08);

/// The running fake controller; stops its thread when dropped.
pub(crate) struct FakeController {
    /// BAR0 (what the driver is given).
    pub(crate) bar: DynBlock,
    /// The DMA space (what the driver is given).
    pub(crate) space: Arc<SoftIommu>,
    /// The disk.
    pub(crate) disk: Arc<Mutex<Vec<u8>>>,
    /// What it saw.
    pub(crate) seen: Arc<Mutex<Seen>>,
    irqs: Vec<EventFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeController {
    /// A controller with a zeroed disk.
    pub(crate) fn new(faults: Faults) -> FakeController {
        let bar = Block::new(Shared::new(0x2000)).erase();
        bar.write::<u32>(0x00, CAP as u32).expect("CAP low");
        bar.write::<u32>(0x04, (CAP >> 32) as u32)
            .expect("CAP high");
        bar.write::<u32>(0x08, 0x0001_0400).expect("VS");
        let space = Arc::new(SoftIommu::new(48).expect("a loopback DMA space"));
        let irqs: Vec<EventFd> = (0..VECTORS)
            .map(|_| EventFd::new().expect("an eventfd"))
            .collect();
        let disk = Arc::new(Mutex::new(vec![0; BLOCKS as usize * LBA_SIZE]));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut device = Device {
            bar: bar.clone(),
            space: space.clone(),
            irqs: irqs
                .iter()
                .map(|e| e.try_clone().expect("eventfd clone"))
                .collect(),
            disk: disk.clone(),
            seen: seen.clone(),
            faults,
            enabled: false,
            shut_down: false,
            sqs: BTreeMap::new(),
            cqs: BTreeMap::new(),
        };
        let stopping = stop.clone();
        let thread = thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                device.step();
                thread::sleep(Duration::from_micros(50));
            }
        });
        FakeController {
            bar,
            space,
            disk,
            seen,
            irqs,
            stop,
            thread: Some(thread),
        }
    }

    /// The controller as the driver takes it: a [`device::Device`] (BAR0, the DMA space, the MSI-X
    /// vectors' eventfds), to make a `Runtime` from.
    pub(crate) fn device(&self) -> Arc<dyn device::Device> {
        Arc::new(FakeDevice {
            identity: Identity {
                name: "fake-nvme".to_owned(),
                kind: Kind::Simulated,
                bdf: "0000:00:04.0".parse().ok(),
            },
            bar: self.bar.clone(),
            space: self.space.clone(),
            irqs: self
                .irqs
                .iter()
                .map(|e| e.try_clone().expect("eventfd clone"))
                .collect(),
        })
    }

    /// What it saw so far.
    pub(crate) fn seen(&self) -> Seen {
        self.seen.lock().expect("seen").clone()
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The fake controller as a [`device::Device`]: what a `Runtime` owns in the driver's tests.
#[derive(Debug)]
struct FakeDevice {
    identity: Identity,
    bar: DynBlock,
    space: Arc<SoftIommu>,
    irqs: Vec<EventFd>,
}

impl device::Device for FakeDevice {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn bar(&self, index: usize) -> Result<DynBlock, device::Error> {
        match index {
            0 => Ok(self.bar.clone()),
            _ => Err(device::Error::NoSuchBar { index }),
        }
    }

    fn dma_space(&self) -> Arc<dyn Space> {
        self.space.clone()
    }

    fn vectors(&self) -> u32 {
        VECTORS as u32
    }

    fn interrupt(&self, vector: u32) -> Result<EventFd, device::Error> {
        let fd = usize::try_from(vector)
            .ok()
            .and_then(|v| self.irqs.get(v))
            .ok_or(device::Error::NoSuchQueue {
                index: vector,
                count: VECTORS as u32,
            })?;
        fd.try_clone()
            .map_err(|source| device::Error::Interrupt { vector, source })
    }

    fn set_masked(&self, _vector: u32, _masked: bool) -> Result<(), device::Error> {
        Ok(())
    }

    /// CC.EN = 0, and waits for the controller thread to clear CSTS.RDY.
    fn reset(&self) -> Result<(), device::Error> {
        let register = |offset| move |source| device::Error::Register { offset, source };
        self.bar.write::<u32>(0x14, 0).map_err(register(0x14))?;
        let start = std::time::Instant::now();
        while self.bar.read::<u32>(0x1c).map_err(register(0x1c))? & 1 != 0 {
            if start.elapsed() > Duration::from_secs(1) {
                return Err(device::Error::Timeout {
                    operation: "clear CSTS.RDY after CC.EN = 0",
                    waited: start.elapsed(),
                });
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

impl Device {
    fn reg(&self, offset: usize) -> u32 {
        self.bar.read::<u32>(offset).expect("register")
    }

    fn set_reg(&self, offset: usize, value: u32) {
        self.bar.write::<u32>(offset, value).expect("register");
    }

    fn reg64(&self, offset: usize) -> u64 {
        u64::from(self.reg(offset)) | (u64::from(self.reg(offset + 4)) << 32)
    }

    /// One pass: CC changes, then every SQ's new entries.
    fn step(&mut self) {
        let cc = self.reg(0x14);
        let en = cc & 1 != 0;
        if en && !self.enabled {
            self.start();
        } else if !en && self.enabled {
            self.reset();
        }
        let shn = (cc >> 14) & 0b11;
        if self.enabled && shn != 0 && !self.shut_down {
            self.shut_down = true;
            self.seen.lock().expect("seen").shutdowns += 1;
            self.set_reg(0x1c, self.reg(0x1c) | (0b10 << 2));
        }
        if !self.enabled || self.shut_down {
            return;
        }
        let qids: Vec<u16> = self.sqs.keys().copied().collect();
        for qid in qids {
            let tail = self.reg(0x1000 + 8 * usize::from(qid));
            // Until the SQ is gone (deleted by a command) or caught up with the tail.
            while let Some(sq) = self.sqs.get(&qid).filter(|sq| sq.head != tail % sq.size) {
                let (base, head, size) = (sq.base, sq.head, sq.size);
                let sqe: Sqe = self
                    .window(base + u64::from(head) * 64, 64)
                    .and_then(|w| w.slice().read::<Sqe>(0).ok())
                    .expect("the SQ entry is mapped");
                if let Some(sq) = self.sqs.get_mut(&qid) {
                    sq.head = (head + 1) % size;
                }
                let (status, result) = if qid == 0 {
                    self.admin(&sqe)
                } else {
                    self.io(&sqe)
                };
                *self
                    .seen
                    .lock()
                    .expect("seen")
                    .commands
                    .entry((qid, sqe.opcode))
                    .or_default() += 1;
                self.complete(qid, &sqe, status, result);
            }
        }
    }

    fn start(&mut self) {
        let aqa = self.reg(0x24);
        let (asq, acq) = (self.reg64(0x28), self.reg64(0x30));
        let cc = self.reg(0x14);
        let ok = asq % PAGE as u64 == 0
            && acq % PAGE as u64 == 0
            && aqa & 0xfff != 0
            && (aqa >> 16) & 0xfff != 0
            && (cc >> 16) & 0xf == 6
            && (cc >> 20) & 0xf == 4
            && (cc >> 7) & 0xf == 0;
        if !ok {
            // CSTS.CFS, as QEMU does when the start fails.
            self.set_reg(0x1c, 0b10);
            return;
        }
        self.sqs.insert(
            0,
            Sq {
                base: asq,
                size: (aqa & 0xfff) + 1,
                head: 0,
                cqid: 0,
            },
        );
        self.cqs.insert(
            0,
            Cq {
                base: acq,
                size: ((aqa >> 16) & 0xfff) + 1,
                tail: 0,
                phase: true,
                vector: 0,
            },
        );
        self.enabled = true;
        self.shut_down = false;
        self.seen.lock().expect("seen").enables += 1;
        self.set_reg(0x1c, 1);
    }

    fn reset(&mut self) {
        self.sqs.clear();
        self.cqs.clear();
        self.enabled = false;
        self.shut_down = false;
        // Doorbells go back to 0 with the queues.
        for offset in (0x1000..0x1100).step_by(4) {
            self.set_reg(offset, 0);
        }
        self.set_reg(0x1c, 0);
    }

    fn window(&self, iova: u64, len: usize) -> Option<userdma::dma::Window> {
        self.space.translate(Iova(iova), len)
    }

    /// Posts the completion of `sqe` on SQ `qid`'s CQ: the entry with the old phase, then the
    /// last word with the new one, then the interrupt.
    fn complete(&mut self, qid: u16, sqe: &Sqe, status: Status, result: u32) {
        let Some(sq) = self.sqs.get(&qid) else {
            return; // deleted by this very command
        };
        let (sq_head, cqid) = (sq.head, sq.cqid);
        let Some(cq) = self.cqs.get_mut(&cqid) else {
            return;
        };
        let field = (u16::from(status.0) << 8) | u16::from(status.1);
        if status != OK {
            self.seen.lock().expect("seen").failed.push(field);
        }
        let mut cqe = Cqe {
            result,
            dw1: 0,
            sq_head: sq_head as u16,
            sq_id: qid,
            command_id: sqe.command_id,
            status: (field << 1) | u16::from(!cq.phase),
        };
        let at = cq.base + u64::from(cq.tail) * 16;
        let window = self
            .space
            .translate(Iova(at), 16)
            .expect("the CQ entry is mapped");
        let slice = window.slice();
        // DW0..DW2 first, with plain stores: the driver reads them only after it has seen the
        // new phase. DW3, which holds the phase tag, is left alone until it is published: the
        // driver polls that word atomically, and a plain store to it meanwhile would race.
        let low = u64::from(cqe.result) | (u64::from(cqe.dw1) << 32);
        slice.write(0, low).expect("CQ entry DW0-DW1");
        let dw2 = u32::from(cqe.sq_head) | (u32::from(cqe.sq_id) << 16);
        slice.write(8, dw2).expect("CQ entry DW2");
        cqe.status ^= 1;
        let dw3 = u32::from(cqe.command_id) | (u32::from(cqe.status) << 16);
        let phase = slice.subslice(12, 4).expect("CQ phase word").as_ptr();
        // SAFETY: `phase` is the 4-byte, 4-aligned DW3 of a mapped CQ entry (the CQ base is
        // page aligned, the entry 16 bytes), which lives while `window` does; the driver
        // accesses this word only atomically, so it may be viewed as an AtomicU32.
        let phase = unsafe { AtomicU32::from_ptr(phase.as_ptr().cast::<u32>()) };
        // Release: the entry's other words before the phase tag that publishes it (pairs with
        // the driver's fence(Acquire) once it sees the tag).
        phase.store(dw3, Ordering::Release);
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        let vector = usize::from(cq.vector);
        self.irqs[vector].signal().expect("MSI-X eventfd");
    }
}
