//! QEMU's `edu` teaching device (`1234:11e8`, QEMU `docs/specs/edu.rst`): BAR0 registers, a DMA
//! engine between host memory and a 4 KiB buffer inside the device, and an interrupt it raises on
//! request. Its DMA mask is 28 bits: addresses above are silently cut.

use std::sync::atomic::{fence, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use userdma::irq::EventFd;
use userdma::mmio::{DynBlock, Field, ReadOnly, ReadWrite, WriteOnly};

use crate::failure::{ensure, Context, Failure};

/// PCI vendor ID.
pub(crate) const VENDOR: u16 = 0x1234;
/// PCI device ID.
pub(crate) const DEVICE: u16 = 0x11e8;
/// PCI class code (`0x00ff00`: unclassified, "other").
pub(crate) const CLASS: u32 = 0x00ff00;
/// Size of BAR0.
pub(crate) const BAR0_LEN: u64 = 1 << 20;
/// Width of the DMA mask.
pub(crate) const DMA_MASK_BITS: u32 = 28;
/// Where the device's DMA buffer sits in its DMA address space.
pub(crate) const BUFFER: u64 = 0x40000;
/// How far into its buffer a transfer may reach, and so the longest transfer. The buffer holds
/// 4096 bytes, but QEMU 7.2 checks a transfer's end off by one and aborts QEMU on one that
/// reaches the buffer's last byte (from offset 0: a transfer of exactly 4096 bytes; fixed in
/// QEMU 8.2.1).
pub(crate) const MAX_TRANSFER: usize = 4095;
/// How long a DMA may take before the case fails. The engine is timer-driven: a transfer ends
/// about 100 ms after it starts; the margin covers a loaded machine under software emulation.
const DMA_TIMEOUT: Duration = Duration::from_secs(10);

// The register map (offsets in BAR0).
const ID: Field<u32, ReadOnly> = Field::new(0x00);
const LIVENESS: Field<u32, ReadWrite> = Field::new(0x04);
const FACTORIAL: Field<u32, ReadWrite> = Field::new(0x08);
const STATUS: Field<u32, ReadWrite> = Field::new(0x20);
const IRQ_STATUS: Field<u32, ReadOnly> = Field::new(0x24);
const IRQ_RAISE: Field<u32, WriteOnly> = Field::new(0x60);
const IRQ_ACK: Field<u32, WriteOnly> = Field::new(0x64);
const DMA_SRC: Field<u64, ReadWrite> = Field::new(0x80);
const DMA_DST: Field<u64, ReadWrite> = Field::new(0x88);
const DMA_COUNT: Field<u64, ReadWrite> = Field::new(0x90);
const DMA_CMD: Field<u64, ReadWrite> = Field::new(0x98);

/// `ID`: the low byte is always `0xed`; above it QEMU puts its major/minor version.
const ID_MAGIC: u32 = 0xed;
/// `ID` of the edu of the QEMU the harness runs (version 1.0).
pub(crate) const ID_VALUE: u32 = 0x0100_00ed;
/// `DMA_CMD`: raise an interrupt (status bit [`IRQ_DMA`]) when the transfer ends.
const DMA_IRQ: u64 = 1 << 2;
/// The interrupt status bit edu raises at the end of a transfer started with [`DMA_IRQ`].
pub(crate) const IRQ_DMA: u32 = 0x100;
/// `STATUS`: a factorial is being computed.
const STATUS_COMPUTING: u32 = 1 << 0;
/// `DMA_CMD`: start (reads back set while the transfer runs).
const DMA_START: u64 = 1 << 0;
/// `DMA_CMD`: direction, device buffer to host memory (clear: host memory to device buffer).
const DMA_TO_RAM: u64 = 1 << 1;

/// Which way a transfer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Host memory to the device's buffer (the device reads host memory).
    ToDevice,
    /// The device's buffer to host memory (the device writes host memory).
    FromDevice,
}

/// What the DMA engine is doing ([`Edu::engine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// No transfer runs: the last one has ended (its bytes are where they go).
    Idle,
    /// A transfer runs.
    Running,
    /// The command register reads all-ones: the device is gone.
    Gone,
}

/// A transfer [`Edu::start`] programmed: what it moves, and when the command went out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transfer {
    /// Which way.
    pub(crate) direction: Direction,
    /// The host side's device address.
    pub(crate) addr: u64,
    /// Where in the device's buffer.
    pub(crate) offset: usize,
    /// Bytes.
    pub(crate) len: usize,
    /// Just before the command write that started it.
    pub(crate) started: Instant,
}

/// An `edu` function, through its BAR0 register block (from `Device::bar(0)`).
#[derive(Debug)]
pub(crate) struct Edu {
    regs: DynBlock,
}

impl Edu {
    /// The device behind its BAR0.
    pub(crate) fn new(regs: DynBlock) -> Result<Edu, Failure> {
        ensure!(
            u64::try_from(regs.len()).is_ok_and(|len| len >= BAR0_LEN),
            "BAR0 is {:#x} bytes, edu's BAR0 is {BAR0_LEN:#x}",
            regs.len()
        );
        Ok(Edu { regs })
    }

    /// Checks that the registers answer as edu's do: the ID register's magic byte, the
    /// liveness register (reads back the complement of what was written) and a factorial.
    /// Returns the ID register.
    pub(crate) fn check_registers(&self) -> Result<u32, Failure> {
        let id = self.regs.get(ID).context(|| "read ID".to_owned())?;
        ensure!(
            id & 0xff == ID_MAGIC,
            "ID register reads {id:#010x}: its low byte should be {ID_MAGIC:#04x} (is this edu, is BAR0 mapped?)"
        );
        for value in [0x1234_5678_u32, 0, u32::MAX, 0xa5a5_5a5a] {
            self.regs
                .set(LIVENESS, value)
                .context(|| "write liveness".to_owned())?;
            let back = self
                .regs
                .get(LIVENESS)
                .context(|| "read liveness".to_owned())?;
            ensure!(
                back == !value,
                "liveness register: wrote {value:#010x}, read {back:#010x}, want {:#010x}",
                !value
            );
        }
        self.regs
            .set(STATUS, 0)
            .context(|| "clear status".to_owned())?;
        self.regs
            .set(FACTORIAL, 10)
            .context(|| "start factorial".to_owned())?;
        let start = Instant::now();
        while self.regs.get(STATUS).context(|| "read status".to_owned())? & STATUS_COMPUTING != 0 {
            ensure!(
                start.elapsed() < DMA_TIMEOUT,
                "factorial of 10 still computing after {DMA_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(1));
        }
        let result = self
            .regs
            .get(FACTORIAL)
            .context(|| "read factorial".to_owned())?;
        ensure!(result == 3_628_800, "10! reads {result}, want 3628800");
        Ok(id)
    }

    /// The ID register, unchecked (all-ones once the device is gone).
    pub(crate) fn id(&self) -> Result<u32, Failure> {
        self.regs.get(ID).context(|| "read ID".to_owned())
    }

    /// Moves `len` bytes between the start of the device's buffer and `addr` (an IOVA or
    /// physical address, whatever the device's DMA path uses), waits for the engine to finish,
    /// and returns how long that took. The engine finishes a transfer whether or not the IOMMU
    /// let it through: whether the bytes arrived is for the caller to check.
    pub(crate) fn dma(
        &self,
        direction: Direction,
        addr: u64,
        len: usize,
    ) -> Result<Duration, Failure> {
        self.wait_idle("before starting a transfer")?;
        let transfer = self.start(direction, addr, 0, len, false)?;
        self.wait_idle("for the transfer to finish")?;
        // Acquire: the loads that check the destination buffer must not be done before the load
        // of DMA_CMD that saw the transfer finish; pairs with the device's writes to host memory
        // before it clears DMA_START.
        fence(Ordering::Acquire);
        Ok(transfer.started.elapsed())
    }

    /// Like [`Edu::dma`], but asks edu to raise its interrupt when the transfer ends, and waits
    /// for that interrupt on `vector` instead of polling the engine. Returns how long it took and
    /// the eventfd's count. The interrupt is left for the caller to check and acknowledge.
    pub(crate) fn dma_irq(
        &self,
        direction: Direction,
        addr: u64,
        len: usize,
        vector: &EventFd,
    ) -> Result<(Duration, u64), Failure> {
        self.wait_idle("before starting a transfer")?;
        let transfer = self.start(direction, addr, 0, len, true)?;
        let (ended, fired) = self.wait_irq(&transfer, vector)?;
        Ok((ended.duration_since(transfer.started), fired))
    }

    /// Starts moving `len` bytes between byte `offset` of the device's buffer and `addr`, with
    /// the interrupt bit when `irq`, and returns without waiting. The engine must be idle: edu
    /// runs one transfer at a time and ignores writes to its DMA registers while one runs, so a
    /// busy engine is an error here rather than a transfer silently not programmed.
    pub(crate) fn start(
        &self,
        direction: Direction,
        addr: u64,
        offset: usize,
        len: usize,
        irq: bool,
    ) -> Result<Transfer, Failure> {
        ensure!(
            len >= 1 && offset.checked_add(len).is_some_and(|end| end <= MAX_TRANSFER),
            "edu transfers 1..={MAX_TRANSFER} bytes within the first {MAX_TRANSFER} of its buffer, not {len} at offset {offset:#x}"
        );
        let count = u64::try_from(len).map_err(|_| Failure::Check(format!("length {len}")))?;
        let inside = u64::try_from(offset)
            .map_err(|_| Failure::Check(format!("offset {offset:#x}")))?
            + BUFFER;
        ensure!(
            addr.checked_add(count - 1)
                .is_some_and(|last| last >> DMA_MASK_BITS == 0),
            "address {addr:#x}+{len:#x} is beyond edu's {DMA_MASK_BITS}-bit DMA mask"
        );
        let cmd = self
            .regs
            .get(DMA_CMD)
            .context(|| "read DMA command".to_owned())?;
        ensure!(
            cmd & DMA_START == 0,
            "the DMA engine is busy (command {cmd:#x}): edu would ignore a {direction:?} DMA of {len} bytes at {addr:#x} programmed now"
        );
        let irq_bit = if irq { DMA_IRQ } else { 0 };
        let (src, dst, cmd) = match direction {
            Direction::ToDevice => (addr, inside, DMA_START | irq_bit),
            Direction::FromDevice => (inside, addr, DMA_START | DMA_TO_RAM | irq_bit),
        };
        let what = || format!("program a {direction:?} DMA of {len} bytes at {addr:#x}");
        self.regs.set(DMA_SRC, src).context(what)?;
        self.regs.set(DMA_DST, dst).context(what)?;
        self.regs.set(DMA_COUNT, count).context(what)?;
        // Release: the stores that filled the source buffer must be visible to the device before
        // the command write that starts it reading; pairs with the device's read of host memory
        // after it sees DMA_START.
        fence(Ordering::Release);
        let started = Instant::now();
        self.regs.set(DMA_CMD, cmd).context(what)?;
        Ok(Transfer {
            direction,
            addr,
            offset,
            len,
            started,
        })
    }

    /// Waits on `vector` for the interrupt that ends `transfer` (started with the interrupt
    /// bit), and returns when it arrived and the eventfd's count. A transfer that does not end
    /// within the timeout is an error naming it and edu's interrupt status.
    pub(crate) fn wait_irq(
        &self,
        transfer: &Transfer,
        vector: &EventFd,
    ) -> Result<(Instant, u64), Failure> {
        let fired = vector
            .wait(Some(DMA_TIMEOUT))
            .context(|| "wait for edu's DMA interrupt".to_owned())?;
        let ended = Instant::now();
        let Some(fired) = fired else {
            let status = self.irq_status()?;
            return Err(Failure::Check(format!(
                "no interrupt within {DMA_TIMEOUT:?} after a {:?} DMA of {} bytes at {:#x} (device offset {:#x}) with the interrupt bit (edu interrupt status {status:#x})",
                transfer.direction, transfer.len, transfer.addr, transfer.offset
            )));
        };
        // Acquire: the destination's bytes are read after the interrupt that says they are
        // there; pairs with the device's writes before it raised the interrupt.
        fence(Ordering::Acquire);
        Ok((ended, fired))
    }

    /// What the DMA engine is doing, from one read of `DMA_CMD`: running a transfer (the start
    /// bit still set), idle, or gone (the all-ones a removed device reads; edu never sets the
    /// command's upper bits). No fence: a caller that goes on to read what an ended transfer
    /// wrote puts an Acquire fence after seeing [`Engine::Idle`].
    pub(crate) fn engine(&self) -> Result<Engine, Failure> {
        let cmd = self
            .regs
            .get(DMA_CMD)
            .context(|| "read DMA command".to_owned())?;
        Ok(if cmd == u64::MAX {
            Engine::Gone
        } else if cmd & DMA_START != 0 {
            Engine::Running
        } else {
            Engine::Idle
        })
    }

    /// Polls until no transfer runs (`when` says what for, in the error).
    pub(crate) fn wait_idle(&self, when: &str) -> Result<(), Failure> {
        let start = Instant::now();
        loop {
            let cmd = self
                .regs
                .get(DMA_CMD)
                .context(|| "read DMA command".to_owned())?;
            if cmd & DMA_START == 0 {
                return Ok(());
            }
            // What a removed device reads; edu never has the command's upper bits set.
            ensure!(
                cmd != u64::MAX,
                "the DMA command register reads all-ones {when}: the device is gone"
            );
            ensure!(
                start.elapsed() < DMA_TIMEOUT,
                "waited {DMA_TIMEOUT:?} {when}: the DMA engine is still busy (command {cmd:#x})"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Raises the interrupt with `bits` in the interrupt status register.
    pub(crate) fn raise_irq(&self, bits: u32) -> Result<(), Failure> {
        self.regs
            .set(IRQ_RAISE, bits)
            .context(|| format!("raise interrupt {bits:#x}"))
    }

    /// The interrupt status register: the bits raised and not acknowledged.
    pub(crate) fn irq_status(&self) -> Result<u32, Failure> {
        self.regs
            .get(IRQ_STATUS)
            .context(|| "read interrupt status".to_owned())
    }

    /// Acknowledges `bits`; the interrupt line drops when no bit is left.
    pub(crate) fn ack_irq(&self, bits: u32) -> Result<(), Failure> {
        self.regs
            .set(IRQ_ACK, bits)
            .context(|| format!("acknowledge interrupt {bits:#x}"))
    }
}
