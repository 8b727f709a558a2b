//! Handles: what C holds instead of pointers.
//!
//! A handle is an opaque pointer type in C (`udma_pool *`), but its value is never an address:
//! it is a 64-bit key, `tag << 56 | generation << 24 | index`, into a table of the library's
//! own (a [`Registry`] per kind of object). The library never dereferences a handle; it decodes
//! it and looks it up, so
//!
//! - NULL is refused (the value 0: every tag is non-zero);
//! - a handle of another kind (a queue passed as a pool) is refused by its tag, and named;
//! - a pointer that is not a handle at all (an address, garbage) has a wrong tag, an index past
//!   the table or a generation the slot never had, and is refused without being touched;
//! - a destroyed (or freed) handle is refused: destroying bumps the slot's generation, so the
//!   old value no longer matches. A slot is reused with a new generation only after that; its
//!   32-bit generation would have to wrap (2^32 reuses of one slot) for a stale handle to
//!   match again.
//!
//! Every check holds in release builds. Each registry is one mutex over a vector: a lookup is
//! a lock, a bounds check and a compare, and objects are `Arc`s cloned out of the lock, so no
//! call keeps the table locked while it works. Buffers and pools, on the hot path, are in
//! lock-free tables of the same keys instead (`crate::slots`).
//! On 64-bit targets only (a handle must hold 64 bits).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{udma_status, Fail};

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the userdma C API packs 64-bit handles into pointers: 64-bit targets only");

/// Bits of the index: at most 2^24 live objects of one kind.
const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// Live objects of one kind at most.
pub(crate) const MAX_LIVE: usize = 1 << INDEX_BITS;

/// The kinds of handle, each with its tag (the top byte of the value) and its C name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Device = 0xd1,
    Mapping = 0xd2,
    Pool = 0xd3,
    Buffer = 0xd4,
    Queue = 0xd5,
    Plan = 0xd6,
    Model = 0xd7,
    Pipeline = 0xd8,
    Streams = 0xd9,
    Engine = 0xda,
    OwnerClient = 0xdb,
}

impl Kind {
    const ALL: [Kind; 11] = [
        Kind::Device,
        Kind::Mapping,
        Kind::Pool,
        Kind::Buffer,
        Kind::Queue,
        Kind::Plan,
        Kind::Model,
        Kind::Pipeline,
        Kind::Streams,
        Kind::Engine,
        Kind::OwnerClient,
    ];

    /// The C type's name without the prefix, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Mapping => "mapping",
            Kind::Pool => "pool",
            Kind::Buffer => "buffer",
            Kind::Queue => "queue",
            Kind::Plan => "plan",
            Kind::Model => "model",
            Kind::Pipeline => "pipeline",
            Kind::Streams => "streams",
            Kind::Engine => "engine",
            Kind::OwnerClient => "client",
        }
    }

    fn of_tag(tag: u64) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u64 == tag)
    }

    /// Who makes this kind of handle, for the message that names what to do.
    fn maker(self) -> &'static str {
        match self {
            Kind::Device => "udma_device_open_loopback or udma_device_open_pci",
            Kind::Mapping => "udma_memory_map",
            Kind::Pool => "udma_pool_create",
            Kind::Buffer => "udma_pool_alloc",
            Kind::Queue => "udma_queue_create",
            Kind::Plan => "udma_plan_create",
            Kind::Model => "udma_model_create_chain or udma_model_create_yolov5s",
            Kind::Pipeline => "udma_pipeline_create",
            Kind::Streams => "udma_streams_create",
            Kind::Engine => "udma_engine_create",
            Kind::OwnerClient => "udma_owner_connect",
        }
    }
}

/// A decoded handle value: which slot, and which occupant of it. One word, the handle's value
/// without its tag (`generation << INDEX_BITS | index`), so that decoding is a mask and it is
/// stored and loaded whole (kept as two 32-bit fields, it was written as two halves and read
/// back as one word on the hot paths: a store-forwarding stall each time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key(u64);

impl Key {
    /// The key of occupant `generation` of slot `index` (below [`MAX_LIVE`]).
    #[inline(always)]
    pub(crate) fn new(index: u32, generation: u32) -> Key {
        debug_assert!((index as usize) < MAX_LIVE);
        Key(u64::from(generation) << INDEX_BITS | u64::from(index) & INDEX_MASK)
    }

    /// The slot.
    #[inline(always)]
    pub(crate) fn index(self) -> u32 {
        (self.0 & INDEX_MASK) as u32
    }

    /// The occupant.
    #[inline(always)]
    pub(crate) fn generation(self) -> u32 {
        (self.0 >> INDEX_BITS) as u32
    }

    /// The value C holds.
    #[inline(always)]
    pub(crate) fn value(self, kind: Kind) -> u64 {
        (kind as u64) << 56 | self.0
    }

    /// The value as the C pointer type.
    pub(crate) fn to_ptr<T>(self, kind: Kind) -> *mut T {
        std::ptr::without_provenance_mut(self.value(kind) as usize)
    }
}

struct Slot<T> {
    /// The current occupant's generation (odd: 1, 2, ... wrapping, never 0); bumped when it
    /// leaves, so every handle of an earlier occupant stops matching.
    generation: u32,
    value: Option<T>,
}

struct Slots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

impl<T> Slots<T> {
    fn insert(&mut self, kind: Kind, value: T) -> Result<Key, Fail> {
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.value = Some(value);
            return Ok(Key::new(index, slot.generation));
        }
        let index = self.slots.len();
        if index >= MAX_LIVE {
            return Err(Fail::new(
                udma_status::UDMA_ERR_EXHAUSTED,
                format!(
                    "{MAX_LIVE} live {} handles, the most the library keeps: destroy some first",
                    kind.name()
                ),
            ));
        }
        self.slots.push(Slot {
            generation: 1,
            value: Some(value),
        });
        Ok(Key::new(index as u32, 1))
    }
}

/// One kind of object, by handle. See the module docs.
pub(crate) struct Registry<T> {
    kind: Kind,
    inner: Mutex<Slots<T>>,
}

impl<T> Registry<T> {
    pub(crate) const fn new(kind: Kind) -> Registry<T> {
        Registry {
            kind,
            inner: Mutex::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots<T>> {
        // A panic while locked (caught at the boundary) leaves the table consistent: every
        // change to it is a single assignment.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `value` and returns its key.
    pub(crate) fn insert(&self, value: T) -> Result<Key, Fail> {
        self.lock().insert(self.kind, value)
    }

    /// Decodes `ptr` as a handle of this registry's kind, checking everything but the slot.
    pub(crate) fn decode<P>(&self, ptr: *const P) -> Result<Key, Fail> {
        decode(self.kind, ptr)
    }

    /// Runs `f` on the live object `ptr` names, with the table locked (keep `f` short).
    pub(crate) fn with<P, R>(
        &self,
        ptr: *const P,
        f: impl FnOnce(Key, &mut T) -> Result<R, Fail>,
    ) -> Result<R, Fail> {
        let key = self.decode(ptr)?;
        let mut slots = self.lock();
        let slot = self.slot(&mut slots, key, ptr.addr() as u64)?;
        let value = slot
            .value
            .as_mut()
            .ok_or_else(|| self.stale(ptr.addr() as u64))?;
        f(key, value)
    }

    /// Runs `f` with the table locked, for operations on several objects at once.
    pub(crate) fn with_all<R>(&self, f: impl FnOnce(&mut Table<'_, T>) -> R) -> R {
        let mut slots = self.lock();
        f(&mut Table {
            registry: self,
            slots: &mut slots,
        })
    }

    /// Removes the object `ptr` names if `check` allows it, and returns it. Its handle (and
    /// every copy of it) is invalid from then on.
    pub(crate) fn remove_if<P>(
        &self,
        ptr: *const P,
        check: impl FnOnce(&T) -> Result<(), Fail>,
    ) -> Result<T, Fail> {
        self.with_all(|table| {
            let key = table.registry.decode(ptr)?;
            check(table.get(key, ptr.addr() as u64)?)?;
            Ok(table.remove(key))
        })
    }

    fn slot<'s>(
        &self,
        slots: &'s mut Slots<T>,
        key: Key,
        value: u64,
    ) -> Result<&'s mut Slot<T>, Fail> {
        match slots.slots.get_mut(key.index() as usize) {
            Some(slot) if slot.generation == key.generation() => Ok(slot),
            // An earlier occupant of a real slot: destroyed. (A generation the slot never had
            // is "foreign"; telling the two apart needs the slot's history, and the message
            // covers both.)
            Some(_) => Err(self.stale(value)),
            None => Err(foreign(self.kind, value)),
        }
    }

    fn stale(&self, value: u64) -> Fail {
        stale(self.kind, value)
    }
}

/// Decodes `ptr` as a handle of `kind`, checking everything but the slot: NULL, the tag.
#[inline]
pub(crate) fn decode<P>(kind: Kind, ptr: *const P) -> Result<Key, Fail> {
    let value = ptr.addr() as u64;
    // NULL has tag 0, which no kind has.
    if value >> 56 != kind as u64 {
        return Err(undecodable(kind, value));
    }
    Ok(Key(value & ((1 << 56) - 1)))
}

/// Why `value` is not a handle of `kind` (off the hot path: it formats).
#[cold]
#[inline(never)]
fn undecodable(kind: Kind, value: u64) -> Fail {
    if value == 0 {
        return Fail::handle(format!(
            "the {} handle is NULL: pass one made by {}",
            kind.name(),
            kind.maker()
        ));
    }
    match Kind::of_tag(value >> 56) {
        Some(other) => Fail::handle(format!(
            "{value:#x} is a {} handle, not a {} handle",
            other.name(),
            kind.name()
        )),
        None => Fail::handle(format!(
            "{value:#x} is not a {} handle made by this library (nor any of its \
             handles): pass one made by {}",
            kind.name(),
            kind.maker()
        )),
    }
}

/// A handle of `kind` whose slot the library never made (an index past the table).
pub(crate) fn foreign(kind: Kind, value: u64) -> Fail {
    Fail::handle(format!(
        "{value:#x} is not a live {} handle of this library: pass one made by {}",
        kind.name(),
        kind.maker()
    ))
}

/// A handle of `kind` whose slot has another occupant (or none) now.
pub(crate) fn stale(kind: Kind, value: u64) -> Fail {
    let verb = match kind {
        Kind::Buffer => "freed",
        Kind::OwnerClient => "disconnected",
        _ => "destroyed",
    };
    Fail::handle(format!(
        "the {} handle {value:#x} was {verb} already (or was never made by this library): \
         a handle is used until it is {verb}, and {verb} once",
        kind.name()
    ))
}

/// The table of a registry, locked ([`Registry::with_all`]).
pub(crate) struct Table<'a, T> {
    registry: &'a Registry<T>,
    slots: &'a mut Slots<T>,
}

impl<T> Table<'_, T> {
    /// The live object under `key` (`value` is the handle, for messages).
    pub(crate) fn get(&mut self, key: Key, value: u64) -> Result<&mut T, Fail> {
        let slot = self.registry.slot(self.slots, key, value)?;
        slot.value
            .as_mut()
            .ok_or_else(|| self.registry.stale(value))
    }

    /// Stores `value` and returns its key.
    pub(crate) fn insert(&mut self, value: T) -> Result<Key, Fail> {
        self.slots.insert(self.registry.kind, value)
    }

    /// Takes the object under `key` out; the caller checked it is live.
    pub(crate) fn remove(&mut self, key: Key) -> T {
        let slot = &mut self.slots.slots[key.index() as usize];
        let value = slot.value.take().expect("checked live by the caller");
        slot.generation = slot.generation.wrapping_add(1).max(1);
        self.slots.free.push(key.index());
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_refused_when_null_foreign_of_another_kind_or_destroyed() {
        let pools: Registry<u32> = Registry::new(Kind::Pool);
        let key = pools.insert(7).expect("insert");
        let ptr: *mut u8 = key.to_ptr(Kind::Pool);
        assert_eq!(pools.with(ptr, |_, v| Ok(*v)).expect("live"), 7);

        let null = pools
            .with(std::ptr::null::<u8>(), |_, v| Ok(*v))
            .unwrap_err();
        assert!(null.message.contains("NULL"), "{}", null.message);
        let queue: *mut u8 = key.to_ptr(Kind::Queue);
        let other = pools.with(queue, |_, v| Ok(*v)).unwrap_err();
        assert!(other.message.contains("queue handle"), "{}", other.message);
        let foreign = pools
            .with(
                std::ptr::without_provenance::<u8>(0x7fff_1234_5678),
                |_, v| Ok(*v),
            )
            .unwrap_err();
        assert!(
            foreign.message.contains("not a pool handle"),
            "{}",
            foreign.message
        );

        assert_eq!(pools.remove_if(ptr, |_| Ok(())).expect("removed"), 7);
        let stale = pools.with(ptr, |_, v| Ok(*v)).unwrap_err();
        assert!(
            stale.message.contains("destroyed already"),
            "{}",
            stale.message
        );
        assert_eq!(stale.status, udma_status::UDMA_ERR_INVALID_HANDLE);
        // The slot is reused with a new generation: the old handle still does not match.
        let again = pools.insert(8).expect("insert");
        assert_ne!(again.value(Kind::Pool), key.value(Kind::Pool));
        assert!(pools.with(ptr, |_, v| Ok(*v)).is_err());
        let past: *const u8 = Key::new(99, 1).to_ptr(Kind::Pool);
        assert!(pools.with(past, |_, v| Ok(*v)).is_err());
    }
}
