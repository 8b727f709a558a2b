//! The register map's codes: descriptor opcodes ([`Opcode`]), completion status codes
//! ([`StatusCode`]), queue fault codes ([`Fault`]), activity-record fault codes
//! ([`ActivityFault`]) and execution units ([`Unit`]), each a
//! fieldless enum with its raw values.

/// Defines a fieldless enum with its variants' raw values, `#[repr]` of the raw type, and its
/// `from_raw` (the variant of a raw value, `None` for any other) from the same list, so each
/// value is written once; `variant as raw` is the other way, and `name` its name.
macro_rules! raw_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $raw:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal,)*
        }
        $(#[$from_meta:meta])*
        fn from_raw;
    ) => {
        $(#[$meta])*
        #[repr($raw)]
        pub enum $name {
            $($(#[$variant_meta])* $variant = $value,)*
        }

        impl $name {
            $(#[$from_meta])*
            pub fn from_raw(raw: $raw) -> Option<$name> {
                match raw {
                    $($value => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// The variant's name, as written here.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)*
                }
            }
        }
    };
}

raw_enum! {
    /// Descriptor opcodes ([`Command::opcode`](userdma::ring::Command::opcode)). Unless stated,
    /// `flags` and every `args` word must be zero, `context` must equal the queue's context
    /// register, and "device offset" is a byte offset in device memory (BAR 2).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Opcode: u8 {
        /// Does nothing; `src`, `dst` and `len` must be zero. Result: 0.
        Nop = 0,
        /// Copies `len` bytes from host IOVA `src` to device offset `dst`. Result: `len`.
        ToDevice = 1,
        /// Copies `len` bytes from device offset `src` to host IOVA `dst`. Result: `len`.
        ToHost = 2,
        /// Copies `len` bytes from device offset `src` to device offset `dst`; the ranges may
        /// overlap (as `memmove`). Result: `len`.
        DeviceCopy = 3,
        /// Sets `len` bytes at device offset `dst` to the byte `args[0]` (`args[0] <= 0xff`);
        /// `src` must be zero. Result: `len`.
        Fill = 4,
        /// For each little-endian `u32` word `w` of the `len` bytes at device offset `src`, in
        /// ascending order, writes `(w ^ args[0]).wrapping_add(args[1])` to the same word of device
        /// offset `dst` (`args[0]`, `args[1]` are `u32` values; `src`, `dst` and `len` multiples of
        /// 4; the ranges may be the same). Result: the wrapping `u64` sum of the words written.
        Compute = 5,
        /// A model layer: one output tensor from up to three input tensors, each output word a
        /// mix of the seed, its index and one word of every input
        /// ([`reference::mix`](crate::reference::mix)). Fields: `src` = device offset of input 0,
        /// `dst` = device offset of the output, `len` = output length in bytes; `args[0]` =
        /// device offset of input 1, `args[1]` = device offset of input 2, `args[2]` = input 0
        /// length (bits 0..32) | input 1 length (bits 32..64), `args[3]` = input 2 length
        /// (bits 0..32) | the layer's seed (bits 32..64). An input of length 0 is absent and
        /// its offset must be 0 (else `BadArgs`); input 0 must be present and `len` non-zero
        /// (else `BadLength`); every offset and length a multiple of 4 (else `Misaligned`).
        /// Output word `j` (little-endian `u32`) is `mix(seed, j, [w_k])` over the present
        /// inputs `k` in ascending order, `w_k` being input `k`'s word at index `j mod words_k`
        /// (a shorter input repeats: a bias or a broadcast). The output range must not overlap
        /// any input range (else `Overlap`): inputs are read word by word while the output is
        /// written. Result: the wrapping `u64` sum of the output words.
        Layer = 6,
        /// Result filtering: keeps the fixed-size records whose score passes a threshold. Reads
        /// the `len` bytes at device offset `src` as records of `args[0]` bytes (4 to 4096, a
        /// multiple of 4; `len` a non-zero multiple of it); a record's score is the
        /// little-endian `u32` at byte `args[1]` of it (a multiple of 4, with `args[1] + 4 <=
        /// args[0]`); it survives if `score >= args[2]` (a `u32`). `args[3]` (a `u32`) is the
        /// output capacity in records. Writes the `8 + args[3] * args[0]` bytes at device
        /// offset `dst` (a multiple of 4, not overlapping the input, else `Overlap`): the
        /// little-endian `u32` count of survivors written (at most the capacity), the `u32`
        /// total of survivors found (saturating at `u32::MAX`), then the first survivors in
        /// input order, packed, and zeros in the slots left over
        /// ([`reference::compact`](crate::reference::compact)). Result: the survivors found.
        Compact = 7,
        /// Waits for another queue: completes once the completed-descriptor counter of queue
        /// `args[0]` ([`QueueRegs::completed`](super::QueueRegs::completed)) is at least `args[1]`.
        /// Until then its queue serves nothing after it (in order), while every other queue goes
        /// on; once it completes, everything the unit serving queue `args[0]` wrote to device
        /// memory before those completions is visible to this queue's later descriptors. `args[0]`
        /// must be another queue of the device (not this one) and `src`, `dst` and `len` must be
        /// zero ([`StatusCode::BadArgs`], [`StatusCode::BadLength`] as for `Nop`). Stopping the
        /// queue or resetting the device releases a pending wait (the queue is torn down). Result:
        /// the counter value seen.
        Wait = 8,
    }

    /// The opcode of a raw value.
    fn from_raw;
}

raw_enum! {
    /// Completion status codes ([`Status::code`](userdma::ring::Status::code)). A descriptor is
    /// checked in this order and fails on the first problem; nothing is read or written unless
    /// every check passed.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum StatusCode: u16 {
        /// Done.
        Success = 0,
        /// `opcode` is not an [`Opcode`].
        BadOpcode = 1,
        /// `flags` is not zero.
        BadFlags = 2,
        /// `context` differs from the queue's context register.
        BadContext = 3,
        /// An `args` word is out of range, a reserved one is not zero, or an address field the
        /// opcode does not use (`src` and `dst` of `Nop`, `src` of `Fill`, the offset of an
        /// absent `Layer` input) is not zero; for `Compact`, a record size outside 4..=4096 or
        /// a score not inside the record.
        BadArgs = 4,
        /// `len` is zero for a data operation, or not zero for `Nop`; `Layer` without input 0;
        /// `Compact` with `len` not a multiple of the record size.
        BadLength = 5,
        /// A range's end (offset plus length) overflows 64 bits: `src + len` or `dst + len`;
        /// for `Layer` each present input, then the output; for `Compact` the input, then the
        /// output. Result: the address.
        AddressOverflow = 6,
        /// `Compute` with `src`, `dst` or `len` not a multiple of 4; `Layer` with any offset
        /// or length not a multiple of 4; `Compact` with `src`, `dst`, the record size or the
        /// score's offset not a multiple of 4.
        Misaligned = 7,
        /// A device-memory range beyond the device memory (for `Layer` the inputs are checked
        /// in order, then the output). Result: the offset.
        DeviceOutOfBounds = 8,
        /// A host range not inside one mapping of the device's DMA space. Result: the IOVA.
        HostUnmapped = 9,
        /// `Layer` or `Compact` whose output range overlaps an input range (checked after
        /// `DeviceOutOfBounds`; these opcodes touch no host memory). Result: the offset of the
        /// first input it overlaps.
        Overlap = 10,
        /// The device failed the descriptor on purpose (fault injection,
        /// [`Kind::ErrorStatus`](crate::fault::Kind::ErrorStatus)); nothing was read or
        /// written. Result: 0.
        Injected = 11,
        /// A host range in a mapping that does not let the device do this: a write into a
        /// device-read-only mapping (`ToHost`), or a read of a device-write-only one
        /// (`ToDevice`) ([`dma::Space::map_with`](userdma::dma::Space::map_with)); nothing
        /// was read or written. Result: the IOVA.
        HostAccess = 12,
    }

    /// The code of a raw value.
    fn from_raw;
}

raw_enum! {
    /// Why a queue stopped ([`QueueRegs::fault`](super::QueueRegs::fault)).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Fault: u32 {
        /// No fault.
        None = 0,
        /// `depth` is not a power of two from 2 to `max_depth`.
        BadDepth = 1,
        /// The ring memory (`ring_base`, the layout's size) is not inside one mapping.
        RingUnmapped = 2,
        /// `ring_base` is not 64-byte aligned.
        RingMisaligned = 3,
        /// The host rang an SQ tail behind the previous one or more than `depth` ahead.
        BadSqTail = 4,
        /// The host rang a CQ head behind the previous one or past the device's CQ tail.
        BadCqHead = 5,
        /// [`QueueRegs::unit`](super::QueueRegs::unit) is not a [`Unit`].
        BadUnit = 6,
    }

    /// The fault of a raw value.
    fn from_raw;
}

raw_enum! {
    /// Why a unit stopped writing activity records
    /// ([`ActivityUnitRegs::fault`](super::ActivityUnitRegs::fault)).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum ActivityFault: u32 {
        /// No fault.
        None = 0,
        /// `records` is not a power of two from 1 to
        /// [`MAX_ACTIVITY_RECORDS`](super::MAX_ACTIVITY_RECORDS).
        BadRecords = 1,
        /// `base` is not 64-byte aligned.
        Misaligned = 2,
        /// The unit's ring of the buffer is not inside one mapping of the DMA space (at the
        /// enable, or later: the host unmapped it while records were enabled).
        Unmapped = 3,
        /// The unit's ring is in a mapping the device may not write (device-read-only).
        NotWritable = 4,
    }

    /// The fault of a raw value.
    fn from_raw;
}

raw_enum! {
    /// The device's execution units ([`QueueRegs::unit`](super::QueueRegs::unit)): each is its own
    /// thread with its own modelled clock, serving only the queues assigned to it, so a copy queue
    /// and a compute queue run concurrently as on an NPU. Any opcode runs on either; the unit only
    /// decides which engine executes it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub enum Unit: u32 {
        /// The DMA (copy) engine, the default.
        #[default]
        Copy = 0,
        /// The compute unit.
        Compute = 1,
    }

    /// The unit of a raw value.
    fn from_raw;
}

impl Unit {
    /// Both units, in register order.
    pub const ALL: [Unit; 2] = [Unit::Copy, Unit::Compute];
}

impl std::fmt::Display for ActivityFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActivityFault::None => "no fault",
            ActivityFault::BadRecords => {
                "the activity records register is not a power of two from 1 to 2^20"
            }
            ActivityFault::Misaligned => "the activity buffer IOVA is not 64-byte aligned",
            ActivityFault::Unmapped => {
                "the unit's ring of the activity buffer is not inside one mapping of the DMA space"
            }
            ActivityFault::NotWritable => {
                "the activity buffer is in a mapping the device may not write"
            }
        })
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::None => "no fault",
            Fault::BadDepth => "the depth register is not a power of two from 2 to max_depth",
            Fault::RingUnmapped => "the ring memory is not inside one mapping of the DMA space",
            Fault::RingMisaligned => "the ring base IOVA is not 64-byte aligned",
            Fault::BadSqTail => "the host rang an impossible SQ tail",
            Fault::BadCqHead => "the host rang an impossible CQ head",
            Fault::BadUnit => "the unit register names no unit of the device",
        })
    }
}
