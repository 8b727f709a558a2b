//! The buffer pool against a reference model: alloc / free / bulk alloc / bulk free / free on
//! another thread / cache flush, on a small pool whose thread caches, cache slots and classes
//! come from the input. After every step: no two live buffers overlap, every buffer is aligned
//! to its class (IOVA and host address), its contents are intact, the per-class and large-buffer
//! counters equal the model's, and every byte of the arena is accounted for. At the end, with
//! every buffer freed and both threads' caches flushed, nothing is outstanding.

#![no_main]

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::dma::{Loopback, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Buffer, Config, Error, Pool, MIN_ALIGN};

const REGION: usize = 2 << 20;
const CHUNK: usize = 64 << 10;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Thread-cache blocks per class (0..=7).
    cache: u8,
    /// Cache slots (1..=2: with one, the helper thread runs uncached).
    slots: u8,
    /// log2 of the largest class minus 8 (256 B ..= 64 KiB).
    max_class: u8,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Alloc(u16),
    Free(u8),
    AllocBulk(u16, u8),
    FreeBulk(u8),
    FreeElsewhere(u8),
    Flush,
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
    next_tag: u64,
}

impl<'p> Model<'p> {
    fn adopt(&mut self, buffer: Buffer<'p>, len: usize) {
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
        let align = capacity.min(CHUNK) as u64;
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
        .thread_cache(usize::from(input.cache % 8))
        .thread_cache_bytes(16 << 10)
        .max_threads(1 + usize::from(input.slots % 2))
        .magazines(8);
    let region = Region::builder(REGION)
        .page_size(PageSize::Base)
        .build()
        .expect("2 MiB of locked memory");
    let mapping = Loopback::new(48).unwrap().map(Arc::new(region)).unwrap();
    let pool = Pool::new(mapping, config).unwrap();
    let (to_helper, inbox) = mpsc::sync_channel::<Buffer<'_>>(0);
    let (acks, acked) = mpsc::sync_channel::<()>(0);
    std::thread::scope(|s| {
        let helper = s.spawn(move || {
            for buffer in inbox {
                drop(buffer);
                acks.send(()).unwrap();
            }
        });
        let mut model = Model {
            pool: &pool,
            live: Vec::new(),
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
                Op::Flush => pool.flush_thread_cache(),
            }
            model.check();
        }
        while let Some(buffer) = model.take(0) {
            drop(buffer);
        }
        model.check();
        drop(to_helper);
        // An explicit join waits for the helper's thread-local destructors (its cache flush).
        helper.join().unwrap();
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
