use std::io::{Read, Seek, SeekFrom, Write};
use std::ptr::NonNull;

use super::*;

bitflags::bitflags! {
    /// A sample status register.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Status: u32 {
        const READY = 1 << 0;
        const ERROR = 1 << 3;
    }
}

impl Value for Status {
    type Raw = u32;
    fn from_raw(raw: u32) -> Self {
        Status::from_bits_retain(raw)
    }
    fn to_raw(self) -> u32 {
        self.bits()
    }
}

/// A sample register layout.
#[repr(C)]
struct Regs {
    id: u16,
    rev: u8,
    flags: u8,
    status: u32,
    base: u64,
    doorbells: [u32; 4],
}

const ID: Field<u16, ReadOnly> = Field::new(std::mem::offset_of!(Regs, id));
const REV: Field<u8, ReadOnly> = Field::new(std::mem::offset_of!(Regs, rev));
const FLAGS: Field<u8, ReadWrite> = Field::new(std::mem::offset_of!(Regs, flags));
const STATUS: Field<Status, ReadClear> = Field::new(std::mem::offset_of!(Regs, status));
const BASE: Field<u64, ReadWrite> = Field::new(std::mem::offset_of!(Regs, base));
const DOORBELL0: Field<u32, WriteOnly> = Field::new(std::mem::offset_of!(Regs, doorbells));

const _: () = assert!(std::mem::size_of::<Regs>() == 32);

#[test]
fn shared_widths_share_bytes_in_memory_order() {
    let regs = Block::new(Shared::new(16));
    regs.write::<u32>(0, 0x1122_3344).unwrap();
    let bytes = 0x1122_3344u32.to_ne_bytes();
    for (i, byte) in bytes.iter().enumerate() {
        assert_eq!(regs.read::<u8>(i).unwrap(), *byte, "byte {i}");
    }
    let halves = [
        u16::from_ne_bytes([bytes[0], bytes[1]]),
        u16::from_ne_bytes([bytes[2], bytes[3]]),
    ];
    assert_eq!(regs.read::<u16>(0).unwrap(), halves[0]);
    assert_eq!(regs.read::<u16>(2).unwrap(), halves[1]);

    // Sub-word writes change only their bytes.
    regs.write::<u8>(1, 0xee).unwrap();
    let mut expect = bytes;
    expect[1] = 0xee;
    assert_eq!(regs.read::<u32>(0).unwrap(), u32::from_ne_bytes(expect));
    regs.write::<u16>(2, 0xabcd).unwrap();
    expect[2..4].copy_from_slice(&0xabcdu16.to_ne_bytes());
    assert_eq!(regs.read::<u32>(0).unwrap(), u32::from_ne_bytes(expect));

    // 64-bit values span two words, in memory order.
    regs.write::<u64>(8, 0x0102_0304_0506_0708).unwrap();
    assert_eq!(regs.read::<u64>(8).unwrap(), 0x0102_0304_0506_0708);
    let raw = 0x0102_0304_0506_0708u64.to_ne_bytes();
    assert_eq!(
        regs.read::<u32>(8).unwrap(),
        u32::from_ne_bytes([raw[0], raw[1], raw[2], raw[3]])
    );
    assert_eq!(
        regs.read::<u32>(12).unwrap(),
        u32::from_ne_bytes([raw[4], raw[5], raw[6], raw[7]])
    );
}

#[test]
fn bad_offsets_are_errors_not_accesses() {
    let backend = Recording::new(Shared::new(16));
    let regs = Block::new(backend.clone());
    assert!(matches!(
        regs.read::<u32>(16),
        Err(Error::OutOfBounds {
            offset: 16,
            len: 4,
            size: 16
        })
    ));
    assert!(matches!(
        regs.read::<u64>(12),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        regs.write::<u8>(usize::MAX, 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        regs.read::<u32>(2),
        Err(Error::Misaligned {
            offset: 2,
            width: Width::U32
        })
    ));
    assert!(matches!(
        regs.write::<u16>(3, 1),
        Err(Error::Misaligned { .. })
    ));
    assert!(
        backend.take_log().is_empty(),
        "no access reached the backend"
    );
    let text = regs.read::<u64>(12).unwrap_err().to_string();
    assert!(text.contains("0xc") && text.contains("0x10"), "{text}");
}

#[test]
fn windows_are_offset_and_checked() {
    let whole = Block::new(Shared::new(64));
    let queue1 = whole.window(16, 8).unwrap();
    assert_eq!((queue1.base(), queue1.len()), (16, 8));
    queue1.write::<u32>(4, 99).unwrap();
    assert_eq!(whole.read::<u32>(20).unwrap(), 99);
    assert!(queue1.read::<u32>(8).is_err(), "past the window");
    assert!(whole.window(60, 8).is_err());
    assert!(whole.window(usize::MAX, 2).is_err());
    // A window at an odd base cannot make an aligned-looking access misaligned.
    let odd = whole.window(2, 8).unwrap();
    assert!(matches!(odd.read::<u32>(0), Err(Error::Misaligned { .. })));
    assert_eq!(odd.read::<u16>(0).unwrap(), 0);
    // Type-erased blocks reach the same registers.
    let erased: DynBlock = queue1.erase();
    assert_eq!(erased.read::<u32>(4).unwrap(), 99);
}

#[test]
fn typed_fields_with_flags() {
    let backend = Recording::new(Shared::new(std::mem::size_of::<Regs>()));
    let mut regs = Block::new(backend.clone());
    backend.inner().write(0, Width::U16, 0x1af4).unwrap();
    backend.inner().write(2, Width::U8, 3).unwrap();
    assert_eq!(regs.get(ID).unwrap(), 0x1af4);
    assert_eq!(regs.get(REV).unwrap(), 3);
    regs.set(FLAGS, 0x80).unwrap();
    regs.modify(FLAGS, |f| f | 1).unwrap();
    assert_eq!(regs.get(FLAGS).unwrap(), 0x81);
    assert_eq!(regs.get(ID).unwrap(), 0x1af4, "neighbours untouched");

    backend
        .inner()
        .write(
            4,
            Width::U32,
            u64::from((Status::READY | Status::ERROR).bits() | 1 << 9),
        )
        .unwrap();
    let status = regs.take(STATUS).unwrap();
    assert!(status.contains(Status::READY | Status::ERROR));
    assert_eq!(status.bits() & (1 << 9), 1 << 9, "unknown bits are kept");

    regs.set(BASE, 0xdead_beef_0000_1000).unwrap();
    assert_eq!(regs.get(BASE).unwrap(), 0xdead_beef_0000_1000);

    let doorbell2 = DOORBELL0.at(2, 4).unwrap();
    assert_eq!(doorbell2.offset(), 24);
    regs.set(doorbell2, 5).unwrap();
    assert!(DOORBELL0.at(usize::MAX, 4).is_none());

    backend.take_log();
    regs.set(DOORBELL0, 7).unwrap();
    assert_eq!(
        backend.take_log(),
        vec![Access {
            op: Op::Write,
            offset: 16,
            width: Width::U32,
            value: 7
        }],
        "one write of the register's width"
    );
    let _ = regs.get(ID).unwrap();
    assert_eq!(
        backend.take_log(),
        vec![Access {
            op: Op::Read,
            offset: 0,
            width: Width::U16,
            value: 0x1af4
        }]
    );
}

#[test]
fn direct_accesses_memory_volatile() {
    let mut backing = vec![0u64; 4];
    let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `backing` outlives `regs` and is not referenced while `regs` is used.
    let regs = Block::new(unsafe { Direct::new(ptr, 32) }.unwrap());
    regs.write::<u64>(8, 0x0123_4567_89ab_cdef).unwrap();
    regs.write::<u8>(0, 0x5a).unwrap();
    regs.write::<u16>(2, 0x1234).unwrap();
    regs.write::<u32>(4, 0xfeed_f00d).unwrap();
    assert_eq!(regs.read::<u64>(8).unwrap(), 0x0123_4567_89ab_cdef);
    assert_eq!(regs.read::<u32>(4).unwrap(), 0xfeed_f00d);
    assert_eq!(regs.read::<u16>(2).unwrap(), 0x1234);
    assert_eq!(regs.read::<u8>(0).unwrap(), 0x5a);
    assert!(regs.read::<u64>(32).is_err());
    let _ = regs;
    assert_eq!(backing[1], 0x0123_4567_89ab_cdef);

    let odd = NonNull::new(ptr.as_ptr().wrapping_add(4)).unwrap();
    // SAFETY: refused before any access.
    let refused = unsafe { Direct::new(odd, 8) };
    assert!(matches!(refused, Err(Error::UnalignedBase { .. })));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: checks the exact width of pread/pwrite on a file, which Miri performs its own way"
)]
fn file_backend_uses_exact_width_pread_pwrite() {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(&[0u8; 0x40]).unwrap();
    let regs = Block::new(FileBacked::new(file.try_clone().unwrap(), 0x20, 0x20));
    regs.write::<u32>(4, 0xa1b2_c3d4).unwrap();
    regs.write::<u16>(0, 0x0102).unwrap();
    regs.write::<u64>(8, 0x1122_3344_5566_7788).unwrap();
    assert_eq!(regs.read::<u32>(4).unwrap(), 0xa1b2_c3d4);
    assert_eq!(regs.read::<u64>(8).unwrap(), 0x1122_3344_5566_7788);
    let mut bytes = [0u8; 0x40];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut bytes).unwrap();
    assert_eq!(
        &bytes[0x20..0x22],
        &[0x02, 0x01],
        "little-endian on the wire"
    );
    assert_eq!(&bytes[0x24..0x28], &0xa1b2_c3d4u32.to_le_bytes());
    assert_eq!(&bytes[0x22..0x24], &[0, 0], "no wider write than asked");

    // A window past the end of the file: a short read is an error that says where.
    let short = Block::new(FileBacked::new(file.try_clone().unwrap(), 0x3c, 8));
    match short.read::<u64>(0) {
        Err(Error::Read {
            offset: 0,
            file_offset: 0x3c,
            width: Width::U64,
            source,
        }) => assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof),
        other => panic!("expected a short-read error, got {other:?}"),
    }

    // A file opened read-only cannot be written: the kernel's errno is kept.
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), [0u8; 8]).unwrap();
    let read_only = std::fs::File::open(path.path()).unwrap();
    let regs = Block::new(FileBacked::new(read_only, 0, 8));
    match regs.write::<u32>(0, 1) {
        Err(Error::Write { source, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EBADF))
        }
        other => panic!("expected EBADF, got {other:?}"),
    }
}

#[test]
fn shared_is_seen_across_threads() {
    let regs = Block::new(Shared::new(8));
    let device = regs.clone();
    let handle = std::thread::spawn(move || {
        while device.read::<u32>(0).unwrap() == 0 {
            std::hint::spin_loop();
        }
        device.read::<u32>(4).unwrap()
    });
    regs.write::<u32>(4, 42).unwrap();
    regs.write::<u32>(0, 1).unwrap();
    // Release/Acquire register ordering: the value written first is seen.
    assert_eq!(handle.join().unwrap(), 42);
}

#[test]
fn raw_registers_of_plain_memory_backends() {
    // Shared: 32-bit registers are atomic words; others go through the backend.
    let shared = Block::new(Shared::new(32));
    let reg = shared.raw_register(8, Width::U32).unwrap().unwrap();
    assert!(reg.is_atomic());
    assert_eq!(reg.width(), Width::U32);
    // SAFETY: `shared` (the backend) lives.
    unsafe { reg.write(0x1_2345_6789) };
    assert_eq!(
        shared.read::<u32>(8).unwrap(),
        0x2345_6789,
        "truncated to 32 bits"
    );
    shared.write::<u32>(8, 7).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { reg.read_u32() }, 7);
    for width in [Width::U8, Width::U16, Width::U64] {
        assert!(shared.raw_register(8, width).unwrap().is_none(), "{width}");
    }
    // Offsets are checked against the window (relative to it), then located in the backend.
    let window = shared.window(16, 16).unwrap();
    let in_window = window.raw_register(4, Width::U32).unwrap().unwrap();
    assert_eq!(
        in_window.as_ptr().as_ptr() as usize,
        reg.as_ptr().as_ptr() as usize + 12
    );
    assert!(matches!(
        window.raw_register(16, Width::U32),
        Err(Error::OutOfBounds { offset: 16, .. })
    ));
    assert!(matches!(
        window.raw_register(2, Width::U32),
        Err(Error::Misaligned { offset: 2, .. })
    ));
    // The backend itself refuses what is outside it.
    assert!(Shared::new(8).raw_register(8, Width::U32).is_none());

    // Direct: every width, volatile at base + offset.
    let mut backing = vec![0u64; 4];
    let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
    {
        // SAFETY: `backing` outlives `regs` and is not referenced while `regs` is used.
        let regs = Block::new(unsafe { Direct::new(ptr, 32) }.unwrap());
        let wide = regs.raw_register(16, Width::U64).unwrap().unwrap();
        assert!(!wide.is_atomic());
        assert_eq!(wide.as_ptr().as_ptr() as usize, ptr.as_ptr() as usize + 16);
        // SAFETY: `regs` lives.
        unsafe { wide.write(0x0123_4567_89ab_cdef) };
        assert_eq!(regs.read::<u64>(16).unwrap(), 0x0123_4567_89ab_cdef);
        let byte = regs.raw_register(3, Width::U8).unwrap().unwrap();
        regs.write::<u8>(3, 0x5a).unwrap();
        // SAFETY: `regs` lives.
        assert_eq!(unsafe { byte.read() }, 0x5a);
        let word = regs.raw_register(4, Width::U32).unwrap().unwrap();
        // SAFETY: `regs` lives; the register is 32-bit.
        unsafe { word.write_u32(0xfeed_f00d) };
        assert_eq!(regs.read::<u32>(4).unwrap(), 0xfeed_f00d);
        assert!(regs.backend().raw_register(32, Width::U8).is_none());
        // Type-erased blocks forward the question to the backend.
        let erased = regs.clone().erase();
        assert!(erased.raw_register(4, Width::U32).unwrap().is_some());
    }
    assert_eq!(backing[2], 0x0123_4567_89ab_cdef);

    // pread/pwrite and recording backends serve no raw registers: every access is theirs.
    let file = tempfile::tempfile().unwrap();
    let regs = Block::new(FileBacked::new(file, 0, 32));
    assert!(regs.raw_register(0, Width::U32).unwrap().is_none());
    let recording = Block::new(Recording::new(Shared::new(32)));
    assert!(recording.raw_register(0, Width::U32).unwrap().is_none());
    assert!(recording
        .clone()
        .erase()
        .raw_register(0, Width::U32)
        .unwrap()
        .is_none());
}
