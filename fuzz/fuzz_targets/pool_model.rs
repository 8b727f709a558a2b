//! The buffer pool against a reference model: alloc / free / bulk alloc / bulk free / batch
//! alloc, fill, push, pop, free (here, or whole on another thread) / free on another thread /
//! cache flush, on a small pool whose thread caches, cache slots, classes and cache colouring
//! come from the input. After every step: no two live buffers overlap, every buffer is aligned
//! to its class (IOVA and host address; 256 bytes in a coloured class), its contents are intact,
//! the per-class and large-buffer counters equal the model's, and every byte of the arena is accounted for. At the end, with
//! every buffer freed and both threads' caches flushed, nothing is outstanding.

#![no_main]

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Batch, Buffer, Config, Error, Pool, MIN_ALIGN};

const REGION: usize = 2 << 20;
const CHUNK: usize = 64 << 10;
/// The thread-cache sizes an input picks from.
const CACHES: [usize; 8] = [0, 1, 2, 3, 5, 7, 40, 96];

#[derive(Debug, Arbitrary)]
struct Input {
    /// Thread-cache blocks per class: one of `CACHES` (small ones that refill and flush every
    /// few operations, and ones that hold a whole batch of 32, which batches then take and give
    /// back as one array).
    cache: u8,
    /// Cache slots (1..=2: with one, the helper thread runs uncached).
    slots: u8,
    /// log2 of the largest class minus 8 (256 B ..= 64 KiB).
    max_class: u8,
    /// Cache colouring (with 64 KiB chunks it colours the 4 KiB class only).
    colouring: bool,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Alloc(u16),
    Free(u8),
    AllocBulk(u16, u8),
    FreeBulk(u8),
    FreeElsewhere(u8),
    /// A new batch of `count % 40` buffers (a batch holds 32: more is refused).
    AllocBatch(u16, u8),
    /// `count % 40` more into a held batch.
    FillBatch(u8, u8),
    /// A live buffer into a held batch (refused unless of its class, or if full).
    PushBatch(u8, u8),
    /// The last buffer of a held batch out, as a live buffer.
    PopBatch(u8),
    /// A held batch freed here, or whole on the helper thread.
    FreeBatch(u8, bool),
    Flush,
}

/// A batch the model holds, with the tag of each of its buffers.
struct HeldBatch<'p> {
    batch: Batch<'p, 32>,
    tags: Vec<u64>,
}

/// A request length from fuzz input: mostly small, sometimes above the largest class.
fn len_of(selector: u16) -> usize {
    let shift = u32::from(selector >> 12); // 0..=15
    1 + usize::from(selector & 0x0fff) % (16usize << shift)
}

/// What the model knows of a live buffer.
struct Live<'p> {
    buffer: Buffer<'p>,
    tag: u64,
}

struct Model<'p> {
    pool: &'p Pool,
    live: Vec<Live<'p>>,
    batches: Vec<HeldBatch<'p>>,
    next_tag: u64,
}

impl<'p> Model<'p> {
    /// Checks a buffer against the buffers of the batches the model holds (`adopt` checks it
    /// against the live ones).
    fn check_new(&self, buffer: &Buffer<'p>) {
        let (start, capacity) = (buffer.offset(), buffer.capacity());
        for held in &self.batches {
            for other in held.batch.iter() {
                let (s, c) = (other.offset(), other.capacity());
                assert!(
                    start + capacity <= s || s + c <= start,
                    "overlap with a batch: {start:#x}+{capacity:#x} and {s:#x}+{c:#x}"
                );
            }
        }
    }

    /// The alignment a buffer of `capacity` bytes has: its size up to a chunk, or 256 bytes in
    /// a coloured class.
    fn align(&self, capacity: usize) -> u64 {
        if self.pool.is_coloured(capacity) {
            MIN_ALIGN as u64
        } else {
            capacity.min(CHUNK) as u64
        }
    }

    /// Tags the buffers `from..` of held batch `b`, checking each against the rest first.
    fn adopt_batch(&mut self, b: usize, from: usize) {
        let len = self.batches[b].batch.buffer_len();
        for i in from..self.batches[b].batch.len() {
            let tag = self.next_tag;
            self.next_tag += 1;
            {
                let held = &self.batches[b];
                let buffer = held.batch.get(i).expect("in the batch");
                assert_eq!(buffer.len(), len);
                assert!(buffer.capacity().is_power_of_two() && buffer.capacity() >= len.max(1));
                assert_eq!(buffer.iova() % self.align(buffer.capacity()), 0);
                // Against the live buffers and the other batches' (and this one's earlier).
                for other in &self.live {
                    let (s, c) = (other.buffer.offset(), other.buffer.capacity());
                    assert!(buffer.offset() + buffer.capacity() <= s || s + c <= buffer.offset());
                }
                for (k, h) in self.batches.iter().enumerate() {
                    let upto = if k == b { i } else { h.batch.len() };
                    for other in h.batch.iter().take(upto) {
                        let (s, c) = (other.offset(), other.capacity());
                        assert!(
                            buffer.offset() + buffer.capacity() <= s || s + c <= buffer.offset(),
                            "batch buffers overlap"
                        );
                    }
                }
                if len >= 8 {
                    buffer.write(0, &tag.to_le_bytes()).unwrap();
                }
            }
            self.batches[b].tags.push(tag);
        }
    }

    /// Checks every buffer of held batch `b` still holds its tag.
    fn verify_batch(&self, b: usize) {
        let held = &self.batches[b];
        assert_eq!(held.batch.len(), held.tags.len());
        if held.batch.buffer_len() >= 8 {
            for (buffer, &tag) in held.batch.iter().zip(&held.tags) {
                let mut bytes = [0u8; 8];
                buffer.read(0, &mut bytes).unwrap();
                assert_eq!(
                    u64::from_le_bytes(bytes),
                    tag,
                    "batch buffer changed under us"
                );
            }
        }
    }

    fn adopt(&mut self, buffer: Buffer<'p>, len: usize) {
        self.check_new(&buffer);
        assert_eq!(buffer.len(), len);
        let capacity = buffer.capacity();
        assert!(capacity >= len.max(1));
        let max_class = self.pool.config().largest_class();
        if len <= max_class {
            assert!(capacity.is_power_of_two() && capacity >= MIN_ALIGN && capacity <= max_class);
        } else {
            assert_eq!(capacity % CHUNK, 0);
            assert!((capacity / CHUNK).is_power_of_two());
        }
        let align = self.align(capacity);
        assert_eq!(buffer.iova() % align, 0, "IOVA aligned to the block");
        assert_eq!(
            (buffer.as_ptr().as_ptr() as u64) % align.min(4096),
            0,
            "host aligned"
        );
        assert_eq!(
            self.pool.mapping().iova(buffer.offset()),
            Some(buffer.iova())
        );
        let start = buffer.offset();
        assert!(start >= self.pool.arena_offset());
        assert!(start + capacity <= self.pool.arena_offset() + self.pool.arena_len());
        for other in &self.live {
            let (s, c) = (other.buffer.offset(), other.buffer.capacity());
            assert!(
                start + capacity <= s || s + c <= start,
                "overlap: {start:#x}+{capacity:#x} and {s:#x}+{c:#x}"
            );
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        // The tag at both ends (they overlap below 16 bytes: the front copy wins).
        if len >= 8 {
            buffer.write(len - 8, &tag.to_le_bytes()).unwrap();
            buffer.write(0, &tag.to_le_bytes()).unwrap();
        }
        self.live.push(Live { buffer, tag });
    }

    fn take(&mut self, selector: u8) -> Option<Buffer<'p>> {
        if self.live.is_empty() {
            return None;
        }
        let Live { buffer, tag } = self
            .live
            .swap_remove(usize::from(selector) % self.live.len());
        let len = buffer.len();
        if len >= 8 {
            let mut bytes = [0u8; 8];
            buffer.read(0, &mut bytes).unwrap();
            assert_eq!(
                u64::from_le_bytes(bytes),
                tag,
                "buffer contents changed under us"
            );
            if len >= 16 {
                buffer.read(len - 8, &mut bytes).unwrap();
                assert_eq!(
                    u64::from_le_bytes(bytes),
                    tag,
                    "buffer contents changed under us"
                );
            }
        }
        Some(buffer)
    }

    /// Counters against the model; valid because no other thread is inside a pool call.
    fn check(&self) {
        let stats = self.pool.stats();
        let mut in_use: BTreeMap<u64, u64> = BTreeMap::new();
        let mut large = 0u64;
        for live in &self.live {
            let capacity = live.buffer.capacity() as u64;
            if live.buffer.len() <= self.pool.config().largest_class() {
                *in_use.entry(capacity).or_default() += 1;
            } else {
                large += capacity;
            }
        }
        for held in &self.batches {
            if let Some(first) = held.batch.get(0) {
                *in_use.entry(first.capacity() as u64).or_default() += held.batch.len() as u64;
            }
        }
        for class in &stats.classes {
            let expected = in_use.get(&class.size).copied().unwrap_or(0);
            assert_eq!(class.in_use, expected, "class {} in use", class.size);
            assert!(class.outstanding >= class.in_use);
            assert_eq!(class.allocs - class.frees, class.in_use);
        }
        assert_eq!(stats.large.in_use_bytes, large);
        assert_eq!(
            stats.accounted_bytes(),
            stats.arena_bytes,
            "every byte accounted for"
        );
    }
}

fuzz_target!(|input: Input| {
    let config = Config::default()
        .chunk_size(CHUNK)
        .max_class(256 << (input.max_class % 9))
        .thread_cache(CACHES[usize::from(input.cache) % CACHES.len()])
        .thread_cache_bytes(512 << 10)
        .max_threads(1 + usize::from(input.slots % 2))
        .magazines(8)
        .colouring(input.colouring);
    let region = Region::builder(REGION)
        .page_size(PageSize::Base)
        .build()
        .expect("2 MiB of locked memory");
    let mapping = SoftIommu::new(48).unwrap().map(Arc::new(region)).unwrap();
    let pool = Pool::new(mapping, config).unwrap();
    let (to_helper, inbox) = mpsc::sync_channel::<Buffer<'_>>(0);
    let (batch_to_helper, batch_inbox) = mpsc::sync_channel::<Batch<'_, 32>>(0);
    let (batch_acks, batch_acked) = mpsc::sync_channel::<()>(0);
    let (acks, acked) = mpsc::sync_channel::<()>(0);
    std::thread::scope(|s| {
        let helper = s.spawn(move || {
            for buffer in inbox {
                drop(buffer);
                acks.send(()).unwrap();
            }
        });
        let batch_helper = s.spawn(move || {
            for batch in batch_inbox {
                drop(batch);
                batch_acks.send(()).unwrap();
            }
        });
        let mut model = Model {
            pool: &pool,
            live: Vec::new(),
            batches: Vec::new(),
            next_tag: 1,
        };
        for op in input.ops.iter().take(512) {
            match *op {
                Op::Alloc(selector) => {
                    let len = len_of(selector);
                    match pool.alloc(len) {
                        Ok(buffer) => model.adopt(buffer, len),
                        Err(Error::Exhausted { .. }) => {}
                        Err(Error::TooLarge { max, .. }) => assert!(len as u64 > max),
                        Err(other) => panic!("unexpected error {other}"),
                    }
                }
                Op::Free(selector) => drop(model.take(selector)),
                Op::AllocBulk(selector, count) => {
                    let len = len_of(selector);
                    let mut batch = Vec::new();
                    match pool.alloc_bulk(len, usize::from(count % 40), &mut batch) {
                        Ok(()) => {
                            assert_eq!(batch.len(), usize::from(count % 40));
                            batch.into_iter().for_each(|b| model.adopt(b, len));
                        }
                        Err(_) => {
                            assert!(batch.is_empty(), "a failed bulk allocation keeps nothing")
                        }
                    }
                }
                Op::FreeBulk(count) => {
                    let batch: Vec<_> = (0..count % 40).filter_map(|i| model.take(i)).collect();
                    pool.free_bulk(batch);
                }
                Op::FreeElsewhere(selector) => {
                    if let Some(buffer) = model.take(selector) {
                        to_helper.send(buffer).unwrap();
                        acked.recv().unwrap();
                    }
                }
                Op::AllocBatch(selector, count) => {
                    let len = len_of(selector);
                    let count = usize::from(count % 40);
                    match pool.alloc_batch::<32>(len, count) {
                        Ok(batch) => {
                            assert_eq!(batch.len(), count);
                            assert!(len <= pool.config().largest_class());
                            model.batches.push(HeldBatch {
                                batch,
                                tags: Vec::new(),
                            });
                            model.adopt_batch(model.batches.len() - 1, 0);
                        }
                        Err(Error::Unbatchable { .. }) => {
                            assert!(len > pool.config().largest_class())
                        }
                        Err(Error::BatchFull { .. }) => assert!(count > 32),
                        Err(Error::Exhausted { .. }) => {}
                        Err(other) => panic!("unexpected error {other}"),
                    }
                }
                Op::FillBatch(which, count) if !model.batches.is_empty() => {
                    let b = usize::from(which) % model.batches.len();
                    let count = usize::from(count % 40);
                    let before = model.batches[b].batch.len();
                    match model.batches[b].batch.fill(count) {
                        Ok(()) => {
                            assert_eq!(model.batches[b].batch.len(), before + count);
                            model.adopt_batch(b, before);
                        }
                        Err(Error::BatchFull { room, .. }) => {
                            assert!(before + count > 32);
                            assert_eq!(room, 32 - before);
                        }
                        Err(Error::Exhausted { .. }) => {}
                        Err(other) => panic!("unexpected error {other}"),
                    }
                    assert!(
                        model.batches[b].batch.len() == before
                            || model.batches[b].batch.len() == before + count
                    );
                    model.verify_batch(b);
                }
                Op::PushBatch(which, selector) if !model.batches.is_empty() => {
                    let b = usize::from(which) % model.batches.len();
                    if let Some(buffer) = model.take(selector) {
                        let (capacity, len) = (buffer.capacity(), buffer.len());
                        let held = &model.batches[b];
                        let class_size = held.batch.buffer_len().max(MIN_ALIGN).next_power_of_two();
                        let fits = held.batch.len() < 32
                            && len <= pool.config().largest_class()
                            && capacity == class_size;
                        match model.batches[b].batch.push(buffer) {
                            Ok(()) => {
                                assert!(fits, "a buffer of another class joined");
                                // It has the batch's length now: tag it as a batch buffer.
                                let at = model.batches[b].batch.len() - 1;
                                model.adopt_batch(b, at);
                            }
                            Err(back) => {
                                assert!(!fits, "a fitting buffer was refused");
                                model.adopt(back, len);
                            }
                        }
                    }
                }
                Op::PopBatch(which) if !model.batches.is_empty() => {
                    let b = usize::from(which) % model.batches.len();
                    model.verify_batch(b);
                    let len = model.batches[b].batch.buffer_len();
                    if let Some(buffer) = model.batches[b].batch.pop() {
                        model.batches[b].tags.pop();
                        model.adopt(buffer, len);
                    }
                }
                Op::FreeBatch(which, elsewhere) if !model.batches.is_empty() => {
                    let b = usize::from(which) % model.batches.len();
                    model.verify_batch(b);
                    let HeldBatch { mut batch, .. } = model.batches.swap_remove(b);
                    if elsewhere {
                        batch_to_helper.send(batch).unwrap();
                        batch_acked.recv().unwrap();
                    } else if batch.len() % 2 == 0 {
                        batch.free();
                        assert!(batch.is_empty());
                    } else {
                        drop(batch);
                    }
                }
                Op::FillBatch(..) | Op::PushBatch(..) | Op::PopBatch(_) | Op::FreeBatch(..) => {}
                Op::Flush => pool.flush_thread_cache(),
            }
            model.check();
        }
        while let Some(buffer) = model.take(0) {
            drop(buffer);
        }
        model.batches.clear();
        model.check();
        drop(to_helper);
        drop(batch_to_helper);
        // An explicit join waits for the helpers' thread-local destructors (their cache flush).
        helper.join().unwrap();
        batch_helper.join().unwrap();
    });
    pool.flush_thread_cache();
    let stats = pool.stats();
    for class in &stats.classes {
        assert_eq!(
            class.outstanding, 0,
            "class {}: blocks out after everything was freed",
            class.size
        );
        assert_eq!(class.free, class.carved);
    }
    assert_eq!(stats.large.in_use_bytes, 0);
    assert_eq!(stats.large.allocs, stats.large.frees);
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
});
