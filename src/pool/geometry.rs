//! Size classes and the geometry of one arena: pure arithmetic, no state.
//!
//! An arena is `[0, len)` cut into chunks of `2^chunk_shift` bytes (the buddy allocator's unit,
//! normally one hugepage). Size class `c` holds blocks of `2^(MIN_SHIFT + c)` bytes; a class takes
//! its blocks from a slab of `max(chunk, block)` bytes, so a block never crosses a chunk boundary
//! unless it is larger than a chunk, and every block is aligned (relative to the arena) to its
//! size. Blocks are named by their *unit*: `offset >> MIN_SHIFT`, a `u32` (arenas up to 1 TiB).
//!
//! **Cache colouring** ([`Config::colouring`]) changes one thing: the blocks of a *coloured* class
//! (4 KiB and up, smaller than a chunk, and only where it costs the slab at most one block in
//! [`COLOUR_LOSS_MAX`]) are carved `size + 256` bytes apart instead of `size`. Blocks aligned to
//! their size all start at the same offset within a page, so their first cache lines all fall into
//! one set of an L1 cache whose way is a page (32 KiB 8-way, the x86 and Arm norm): touching the
//! first line of more than 8 of them in a row misses on each. At a stride of `size + 256`
//! consecutive blocks start 256 bytes further into the page each time, 16 positions before the
//! pattern repeats, so 16 times as many first lines fit. The price: blocks are aligned to 256 bytes
//! only, and a slab holds fewer blocks (in 2 MiB: 481 of 4 KiB instead of 512, 31 of 64 KiB instead
//! of 32).

use super::{Config, Error};

/// log2 of the smallest block: 256 bytes, the DMA alignment every buffer honours.
pub(crate) const MIN_SHIFT: u32 = 8;
/// The smallest block and the alignment of every buffer, in bytes.
pub(crate) const MIN_BLOCK: usize = 1 << MIN_SHIFT;
/// log2 of the largest size class a pool may be configured with (1 GiB).
pub(crate) const MAX_CLASS_SHIFT: u32 = 30;
/// Number of size classes the fixed per-class tables have room for (256 B ..= 1 GiB).
pub(crate) const MAX_CLASSES: usize = (MAX_CLASS_SHIFT - MIN_SHIFT + 1) as usize;
/// Largest magazine a thread cache keeps per class: every slot has room for this many in each
/// class, which takes memory only where a thread uses a class (see `cache::Slots`); a class's
/// capacity (`ClassGeometry::cap`, given to it by `cache::OwnedSlot::enable`) is at most this.
#[cfg(not(loom))]
pub(crate) const MAG_MAX: usize = 512;
/// Largest magazine a thread cache keeps per class. The loom models use caches of two blocks
/// and run on 32 KiB coroutine stacks, which a slot built there with full-size magazines, or
/// the slow paths' `BATCH_MAX` arrays, would overflow.
#[cfg(loom)]
pub(crate) const MAG_MAX: usize = 8;
const _: () = assert!(
    MAG_MAX.is_power_of_two(),
    "magazine indices are masked with MAG_MAX - 1"
);
/// Largest batch moved between a thread cache and the shared lists (half a full magazine), and
/// the capacity of a depot magazine.
pub(crate) const BATCH_MAX: usize = MAG_MAX / 2;
/// Number of buddy orders the shared tables have room for (a block of `2^order` chunks).
pub(crate) const MAX_ORDERS: usize = 33;
/// log2 of the smallest class cache colouring spreads (4 KiB: one L1 way on x86 and Arm).
pub(crate) const MIN_COLOURED_SHIFT: u32 = 12;
/// A class is coloured only if colouring costs its slab at most one block in this many.
pub(crate) const COLOUR_LOSS_MAX: u64 = 16;
/// log2 of the largest arena: units must fit a `u32`.
pub(crate) const MAX_ARENA_SHIFT: u32 = 32 + MIN_SHIFT;

/// The size class of a request of `len` bytes: the smallest `c` with `len <= 2^(MIN_SHIFT + c)`.
/// Computed from `leading_zeros`; `0` and `1..=256` are class 0. The result may exceed the
/// pool's classes (then the request goes to the buddy allocator).
#[inline(always)]
pub(crate) fn class_of(len: usize) -> usize {
    let bits = usize::BITS - len.saturating_sub(1).leading_zeros();
    // `bits <= 64`, so the cast cannot truncate.
    bits.saturating_sub(MIN_SHIFT) as usize
}

/// `ceil(log2(n))` for `n >= 1`; `0` for `n <= 1`.
pub(crate) fn ceil_log2(n: u64) -> u32 {
    u64::BITS - n.saturating_sub(1).leading_zeros()
}

/// Per-class constants, copied into every thread cache at registration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClassGeometry {
    /// log2 of the block size.
    pub(crate) shift: u32,
    /// Buddy order of one slab of this class (`2^slab_order` chunks).
    pub(crate) slab_order: u32,
    /// Thread-cache magazine capacity for this class (0: no caching).
    pub(crate) cap: u32,
    /// Blocks moved per refill or flush (`max(cap / 2, 1)`, at most [`BATCH_MAX`]).
    pub(crate) batch: u32,
    /// Distance between two blocks of a slab, in units: the block size, or one unit more for a
    /// coloured class.
    pub(crate) stride: u32,
    /// For a coloured class (odd stride), the inverse of `stride` modulo 2^32, with which
    /// [`Geometry::is_block`] tests divisibility by a multiplication; 0 for an uncoloured one.
    pub(crate) stride_inverse: u32,
    /// For a coloured class, the index of a slab's last block (blocks per slab - 1).
    pub(crate) last_index: u32,
}

/// The inverse of the odd `d` modulo 2^32 (Newton's iteration: each step doubles the bits that
/// are right, from the 3 of `d * d ≡ 1 mod 8`).
const fn inverse_mod_2_32(d: u32) -> u32 {
    let mut x = d;
    let mut i = 0;
    while i < 4 {
        x = x.wrapping_mul(2u32.wrapping_sub(d.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// Everything derived from a [`Config`] and an arena length; identical in every process that
/// opens the same shared pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Arena length in bytes, a multiple of the chunk size.
    pub(crate) len: u64,
    /// log2 of the chunk (buddy unit) size.
    pub(crate) chunk_shift: u32,
    /// Number of chunks in the arena.
    pub(crate) chunks: u32,
    /// Largest buddy order with a block inside the arena.
    pub(crate) max_order: u32,
    /// Number of 256-byte units (the size of the link table).
    pub(crate) units: u32,
    /// Number of size classes in use.
    pub(crate) classes: usize,
    /// Constants per class (first `classes` entries used).
    pub(crate) class: [ClassGeometry; MAX_CLASSES],
    /// Number of depot magazines.
    pub(crate) magazines: u32,
    /// Number of thread-cache slots.
    pub(crate) threads: usize,
}

impl Geometry {
    /// Checks `config` against an arena of `len` bytes (rounded down to whole chunks).
    ///
    /// # Errors
    /// [`Error::Config`] naming the first field that is out of range, or
    /// [`Error::ArenaTooSmall`] / [`Error::ArenaTooLarge`].
    pub(crate) fn new(len: u64, config: &Config) -> Result<Self, Error> {
        let bad = |field: &'static str, value: u64, expected: &'static str| {
            Err(Error::Config {
                field,
                value,
                expected,
            })
        };
        let chunk = config.chunk_size as u64;
        if !chunk.is_power_of_two() || chunk < MIN_BLOCK as u64 || chunk > 1 << MAX_CLASS_SHIFT {
            return bad("chunk_size", chunk, "a power of two from 256 B to 1 GiB");
        }
        let max_class = config.max_class as u64;
        if !max_class.is_power_of_two()
            || max_class < MIN_BLOCK as u64
            || max_class > 1 << MAX_CLASS_SHIFT
        {
            return bad("max_class", max_class, "a power of two from 256 B to 1 GiB");
        }
        if config.thread_cache > MAG_MAX {
            // MAG_MAX (the loom build's smaller limit is never reached by its models).
            return bad(
                "thread_cache",
                config.thread_cache as u64,
                "at most 512 blocks",
            );
        }
        if config.max_threads > 4096 {
            return bad("max_threads", config.max_threads as u64, "at most 4096");
        }
        if config.magazines > 1 << 24 {
            return bad("magazines", config.magazines as u64, "at most 2^24");
        }
        let align = config.dma_alignment_bytes() as u64;
        if !align.is_power_of_two() || align > 1 << MAX_CLASS_SHIFT {
            return bad("dma_alignment", align, "a power of two from 1 B to 1 GiB");
        }
        if config.colouring_enabled()
            && config.dma_alignment_set().is_some()
            && align > MIN_BLOCK as u64
        {
            // Coloured blocks are 256-byte aligned only: refused for a stated alignment above
            // that (colouring asked for with none stated is the caller's choice).
            return bad(
                "dma_alignment",
                align,
                "at most 256 B with colouring on: turn colouring off (Config::colouring(false)) \
                 for a device that needs more",
            );
        }
        let chunk_shift = chunk.trailing_zeros();
        let len = len & !(chunk - 1);
        let max_class_shift = max_class.trailing_zeros();
        let slab = chunk.max(max_class);
        if len < slab {
            return Err(Error::ArenaTooSmall { len, needed: slab });
        }
        if len > 1 << MAX_ARENA_SHIFT {
            return Err(Error::ArenaTooLarge {
                len,
                max: 1 << MAX_ARENA_SHIFT,
            });
        }
        let chunks = u32::try_from(len >> chunk_shift).map_err(|_| Error::ArenaTooLarge {
            len,
            max: 1 << MAX_ARENA_SHIFT,
        })?;
        let units = u32::try_from(len >> MIN_SHIFT).map_err(|_| Error::ArenaTooLarge {
            len,
            max: 1 << MAX_ARENA_SHIFT,
        })?;
        let classes = (max_class_shift - MIN_SHIFT + 1) as usize;
        let mut class = [ClassGeometry::default(); MAX_CLASSES];
        for (c, g) in class.iter_mut().enumerate().take(classes) {
            // `c < MAX_CLASSES`, so the cast is exact.
            let shift = MIN_SHIFT + c as u32;
            // At most MAG_MAX (checked above): fits.
            let cap = config.thread_cache_blocks(1 << shift) as u32;
            let size_units = 1u32 << (shift - MIN_SHIFT);
            // Coloured: asked for, big enough to alias, and cheap: a one-chunk slab holds
            // `plain` blocks `size` apart and `fit` blocks `size + 256` apart (the last one
            // needing only `size`), and colouring may cost at most one in COLOUR_LOSS_MAX.
            let coloured = config.colouring_enabled()
                && shift >= MIN_COLOURED_SHIFT
                && shift < chunk_shift
                && {
                    let plain = chunk >> shift;
                    let fit = (chunk - (1 << shift)) / ((1 << shift) + MIN_BLOCK as u64) + 1;
                    fit * COLOUR_LOSS_MAX >= plain * (COLOUR_LOSS_MAX - 1)
                };
            let (stride, stride_inverse, last_index) = if coloured {
                let stride = size_units + 1;
                // `shift < chunk_shift <= 30`: the chunk's units fit a `u32`.
                let chunk_units = (chunk >> MIN_SHIFT) as u32;
                let last = (chunk_units - size_units) / stride;
                (stride, inverse_mod_2_32(stride), last)
            } else {
                (size_units, 0, 0)
            };
            *g = ClassGeometry {
                shift,
                slab_order: shift.saturating_sub(chunk_shift),
                cap,
                batch: (cap / 2).clamp(1, BATCH_MAX as u32),
                stride,
                stride_inverse,
                last_index,
            };
        }
        Ok(Self {
            len,
            chunk_shift,
            chunks,
            max_order: u32::BITS - 1 - chunks.leading_zeros(),
            units,
            classes,
            class,
            magazines: config.magazines as u32,
            threads: config.max_threads,
        })
    }

    /// Block size of class `c`.
    #[inline(always)]
    pub(crate) fn block_size(&self, c: usize) -> u64 {
        1 << self.class[c].shift
    }

    /// Distance between two blocks of class `c` in a slab, in bytes.
    #[inline(always)]
    pub(crate) fn stride(&self, c: usize) -> u64 {
        u64::from(self.class[c].stride) << MIN_SHIFT
    }

    /// Whether `unit` can be a block of class `c`: inside the arena and where the class's
    /// slabs put blocks (aligned to the class size, or, coloured, a whole number of strides
    /// into a chunk with the block inside it). A multiplication and compares, no division:
    /// this runs on every block a refill takes from memory another process may share.
    #[inline(always)]
    pub(crate) fn is_block(&self, c: usize, unit: u32) -> bool {
        let class = &self.class[c];
        if unit >= self.units {
            return false;
        }
        if class.stride_inverse == 0 {
            return unit & (class.stride - 1) == 0;
        }
        // Coloured classes have one-chunk slabs (`shift < chunk_shift`), so a block's unit in
        // its slab is its unit in its chunk, `r`. Multiplying by the odd stride's inverse
        // `d⁻¹` maps the multiple `k * d` to `k`, and every other `r < 2^32` above
        // `(2^32 - 1) / d`, which is at least the last index (`last_index * d < 2^32`). So
        // one compare says both "a whole number of strides" and "not past the slab's last".
        let in_slab = unit & ((1u32 << (self.chunk_shift - MIN_SHIFT)) - 1);
        in_slab.wrapping_mul(class.stride_inverse) <= class.last_index
    }

    /// Chunk size in bytes.
    pub(crate) fn chunk_size(&self) -> u64 {
        1 << self.chunk_shift
    }

    /// The buddy order serving a request of `len` bytes, or `None` if no block of the arena is
    /// that large.
    pub(crate) fn order_of(&self, len: u64) -> Option<u32> {
        let chunks = len.div_ceil(self.chunk_size()).max(1);
        let order = ceil_log2(chunks);
        (order <= self.max_order).then_some(order)
    }

    /// Byte offset of unit `unit`.
    #[inline(always)]
    pub(crate) fn offset(unit: u32) -> u64 {
        u64::from(unit) << MIN_SHIFT
    }

    /// Unit of byte offset `offset` (a multiple of 256 inside the arena).
    #[inline(always)]
    pub(crate) fn unit(offset: u64) -> u32 {
        // Offsets inside an arena are below `2^MAX_ARENA_SHIFT` (checked in `new`), so the unit
        // fits in 32 bits.
        (offset >> MIN_SHIFT) as u32
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn class_boundaries() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(256), 0);
        assert_eq!(class_of(257), 1);
        assert_eq!(class_of(512), 1);
        assert_eq!(class_of(4096), 4);
        assert_eq!(class_of(4097), 5);
        assert_eq!(class_of(1 << 20), 12);
        assert_eq!(class_of(usize::MAX), 56);
        for shift in MIN_SHIFT..40 {
            let size = 1usize << shift;
            assert_eq!(class_of(size), (shift - MIN_SHIFT) as usize);
            assert_eq!(class_of(size + 1), (shift - MIN_SHIFT + 1) as usize);
        }
    }

    #[test]
    fn ceil_log2_values() {
        assert_eq!(ceil_log2(0), 0);
        assert_eq!(ceil_log2(1), 0);
        assert_eq!(ceil_log2(2), 1);
        assert_eq!(ceil_log2(3), 2);
        assert_eq!(ceil_log2(4), 2);
        assert_eq!(ceil_log2(5), 3);
    }

    #[test]
    fn geometry_of_default_config() {
        let g = Geometry::new(64 << 20, &Config::default()).unwrap();
        assert_eq!(g.chunk_shift, 21);
        assert_eq!(g.chunks, 32);
        assert_eq!(g.max_order, 5);
        assert_eq!(g.classes, 13);
        assert_eq!(g.units, (64 << 20) >> 8);
        assert_eq!(g.class[0].cap, 512);
        assert_eq!(g.class[0].batch, 256);
        // 4 KiB blocks: 512 of them are 2 MiB, the byte cap.
        assert_eq!(g.class[4].cap, 512);
        assert_eq!(g.class[4].batch, 256);
        // 8 KiB blocks: the byte cap leaves 256.
        assert_eq!(g.class[5].cap, 256);
        assert_eq!(g.class[5].batch, 128);
        // What the config tells its users is what the geometry gives each class.
        let config = Config::default();
        for (len, class) in [(1, 0), (4096, 4), (3000, 4), (5000, 5), (1 << 20, 12)] {
            assert_eq!(config.thread_cache_blocks(len), g.class[class].cap as usize);
        }
        assert_eq!(
            config.thread_cache_blocks((1 << 20) + 1),
            0,
            "above the largest class"
        );
        assert_eq!(config.clone().thread_cache(1).thread_cache_blocks(4096), 0);
        // 64 KiB blocks: the byte cap leaves 32.
        assert_eq!(g.class[8].cap, 32);
        // 1 MiB blocks: the byte cap leaves two per thread.
        assert_eq!(g.class[12].cap, 2);
        assert_eq!(g.class[12].batch, 1);
        assert_eq!(g.class[12].slab_order, 0);
        assert_eq!(g.order_of(1), Some(0));
        assert_eq!(g.order_of(2 << 20), Some(0));
        assert_eq!(g.order_of((2 << 20) + 1), Some(1));
        assert_eq!(g.order_of(64 << 20), Some(5));
        assert_eq!(g.order_of((64 << 20) + 1), None);
    }

    #[test]
    fn geometry_rounds_down_and_rejects() {
        let g = Geometry::new((8 << 20) + 4096, &Config::default()).unwrap();
        assert_eq!(g.len, 8 << 20);
        assert_eq!(g.max_order, 2);
        let g = Geometry::new(6 << 20, &Config::default()).unwrap();
        assert_eq!(g.chunks, 3);
        assert_eq!(g.max_order, 1);
        assert!(matches!(
            Geometry::new(1 << 20, &Config::default()),
            Err(Error::ArenaTooSmall { .. })
        ));
        assert!(matches!(
            Geometry::new(8 << 20, &Config::default().chunk_size(3000)),
            Err(Error::Config {
                field: "chunk_size",
                ..
            })
        ));
        assert!(matches!(
            Geometry::new(8 << 20, &Config::default().max_class(100)),
            Err(Error::Config {
                field: "max_class",
                ..
            })
        ));
        // The message names the limit (written out, as `expected` is a static string).
        assert!(matches!(
            Geometry::new(8 << 20, &Config::default().thread_cache(MAG_MAX + 1)),
            Err(Error::Config {
                field: "thread_cache",
                expected,
                ..
            }) if expected == format!("at most {MAG_MAX} blocks")
        ));
        // A largest class above the chunk size takes multi-chunk slabs.
        let g = Geometry::new(64 << 20, &Config::default().max_class(8 << 20)).unwrap();
        assert_eq!(g.classes, 16);
        assert_eq!(g.class[15].slab_order, 2);
    }

    #[test]
    fn stride_inverses_invert() {
        for d in (1u32..20_000).step_by(2).chain([(1 << 22) + 1, u32::MAX]) {
            assert_eq!(d.wrapping_mul(inverse_mod_2_32(d)), 1, "inverse of {d}");
        }
    }

    /// The units a slab of class `c` starting at unit 0 gets, the way `Central::carve` lays
    /// them out: `size` for the first, `stride` for each further one.
    fn carved(g: &Geometry, c: usize) -> Vec<u32> {
        let (size, stride) = (g.block_size(c), g.stride(c));
        let slab = g.chunk_size() << g.class[c].slab_order;
        (0..)
            .map(|i| i * stride)
            .take_while(|offset| offset + size <= slab)
            .map(Geometry::unit)
            .collect()
    }

    #[test]
    fn the_layout_follows_the_dma_alignment_unless_set() {
        let coloured = |config: &Config| {
            let g = Geometry::new(64 << 20, config).unwrap();
            g.class[4].stride_inverse != 0
        };
        // Unstated: a base page, so page aligned.
        assert_eq!(Config::default().dma_alignment_bytes(), 4096);
        assert!(!Config::default().colouring_enabled());
        assert!(!coloured(&Config::default()));
        // A device that takes 256 bytes (or less) gets the coloured layout; one that needs
        // more, the aligned one.
        for align in [1, 64, 256] {
            let config = Config::default().dma_alignment(align);
            assert!(config.colouring_enabled() && coloured(&config), "{align}");
        }
        for align in [512, 4096, 1 << 21] {
            let config = Config::default().dma_alignment(align);
            assert!(!config.colouring_enabled() && !coloured(&config), "{align}");
        }
        // A caller's choice wins where the alignment allows it.
        assert!(!coloured(
            &Config::default().dma_alignment(256).colouring(false)
        ));
        assert!(coloured(&Config::default().colouring(true)));
        // Colouring for a device that needs more than 256 bytes, or an alignment that is not a
        // power of two (or above 1 GiB), is refused, naming the field.
        for config in [
            Config::default().dma_alignment(4096).colouring(true),
            Config::default().dma_alignment(3000),
            Config::default().dma_alignment(0),
            Config::default().dma_alignment(1 << 31),
        ] {
            assert!(
                matches!(
                    Geometry::new(64 << 20, &config),
                    Err(Error::Config {
                        field: "dma_alignment",
                        ..
                    })
                ),
                "{config:?}"
            );
        }
    }

    #[test]
    fn colouring_picks_the_classes_it_pays_for() {
        let g = Geometry::new(64 << 20, &Config::default().colouring(true)).unwrap();
        for c in 0..g.classes {
            let size = g.block_size(c);
            // 4 KiB ..= 128 KiB lose at most one block in 16 of a 2 MiB slab; 256 KiB would
            // lose one in 8 (7 blocks instead of 8).
            let coloured = (4 << 10..=128 << 10).contains(&size);
            assert_eq!(g.class[c].stride_inverse != 0, coloured, "class {size}");
            let stride = if coloured { size + 256 } else { size };
            assert_eq!(g.stride(c), stride, "class {size}");
        }
        // 4 KiB: 481 blocks 4352 bytes apart in 2 MiB instead of 512.
        assert_eq!(carved(&g, 4).len(), 481);
        assert_eq!(g.class[4].last_index, 480);
        // 64 KiB: 31 instead of 32 (the last block starts 30 * 256 bytes further on).
        assert_eq!(carved(&g, 8).len(), 31);
        // Off by default; with 64 KiB chunks, 4 KiB is coloured (15 of 16 blocks) and 32 KiB,
        // which would keep one block of two, is not.
        let plain = Geometry::new(64 << 20, &Config::default()).unwrap();
        assert!(plain.class.iter().all(|class| class.stride_inverse == 0));
        let small = Config::default()
            .chunk_size(64 << 10)
            .max_class(64 << 10)
            .colouring(true);
        let g = Geometry::new(8 << 20, &small).unwrap();
        assert_eq!(carved(&g, 4).len(), 15);
        assert_ne!(g.class[4].stride_inverse, 0);
        assert_eq!(g.class[7].stride_inverse, 0);
        // Chunks of 32 KiB leave 7 of 8: no class is coloured.
        let tiny = small.chunk_size(32 << 10).max_class(32 << 10);
        let g = Geometry::new(8 << 20, &tiny).unwrap();
        assert!(g.class.iter().all(|class| class.stride_inverse == 0));
    }

    #[test]
    fn is_block_accepts_exactly_the_carved_units() {
        let mut configs = vec![Config::default()
            .chunk_size(64 << 10)
            .max_class(64 << 10)
            .colouring(true)];
        // Under Miri (scripts/miri.sh) the 64 KiB-chunk geometry only: 2 MiB slabs hold up to
        // 8192 blocks a class, minutes of interpreted set building.
        if !cfg!(miri) {
            configs.extend([Config::default(), Config::default().colouring(true)]);
        }
        for config in configs {
            let g = Geometry::new(8 << 20, &config).unwrap();
            let chunk_units = (g.chunk_size() >> MIN_SHIFT) as u32;
            for c in 0..g.classes {
                let slab_units = chunk_units << g.class[c].slab_order;
                let in_slab: std::collections::BTreeSet<u32> = carved(&g, c).into_iter().collect();
                // Every unit of the first two slabs (under Miri the first), and of the arena's
                // last one.
                let last_slab = g.units - slab_units;
                let first = if cfg!(miri) { 1 } else { 2 };
                for unit in (0..first * slab_units).chain(last_slab..g.units) {
                    let expected = in_slab.contains(&(unit % slab_units));
                    assert_eq!(g.is_block(c, unit), expected, "class {c}, unit {unit}");
                }
                assert!(!g.is_block(c, g.units));
                assert!(!g.is_block(c, u32::MAX));
            }
        }
    }
}
