//! The planner's output, [`Plan`], and its independent checker, [`Plan::validate`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::Duration;

use super::problem::{align_up, LowerBound};
use super::{Strategy, Tensor};

/// Where one tensor lives in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The tensor's id.
    pub id: u64,
    /// Its offset in the arena (a multiple of the plan's alignment).
    pub offset: u64,
    /// Its size in bytes, as given.
    pub bytes: u64,
    /// The id whose memory it took (in-place reuse or aliasing), if any.
    pub inplace_of: Option<u64>,
}

/// Every tensor's offset in one arena, with the figures to judge it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The strategy that produced these offsets (for `auto`, the one that won).
    pub strategy: Strategy,
    /// The arena alignment every offset and size is rounded to.
    pub align: u64,
    /// The arena size: the end of the highest (aligned) tensor.
    pub arena_bytes: u64,
    /// No arena can be smaller than this.
    pub lower_bound: LowerBound,
    /// Every tensor in its own aligned range.
    pub naive_bytes: u64,
    /// Proven: no smaller arena exists for this problem (with its sharing decisions).
    pub optimal: bool,
    /// How long planning took.
    pub elapsed: Duration,
    /// One per tensor, in input order.
    pub placements: Vec<Placement>,
    /// For `colour`: the shared buffers' sizes (their sum is the arena above any fixed
    /// tensors). Empty for the other strategies.
    pub buffers: Vec<u64>,
}

/// Why [`Plan::validate`] rejected a plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// The plan does not have one placement per tensor, in order.
    #[error("placement {index} is for id {found:?}, expected tensor {expected}")]
    Mismatch {
        /// The position.
        index: usize,
        /// The tensor id there.
        expected: u64,
        /// The placement's id, if any.
        found: Option<u64>,
    },
    /// An offset is not a multiple of the alignment.
    #[error("tensor {id}: offset {offset} is not a multiple of {align}")]
    Misaligned {
        /// The tensor.
        id: u64,
        /// Its offset.
        offset: u64,
        /// The alignment.
        align: u64,
    },
    /// A pre-placed tensor was moved.
    #[error("tensor {id}: placed at {offset}, but fixed at {fixed}")]
    FixedMoved {
        /// The tensor.
        id: u64,
        /// Where it was placed.
        offset: u64,
        /// Where it is fixed.
        fixed: u64,
    },
    /// A tensor ends beyond the arena.
    #[error("tensor {id}: [{offset}, {end}) ends beyond the arena of {arena} bytes")]
    OutsideArena {
        /// The tensor.
        id: u64,
        /// Its offset.
        offset: u64,
        /// Its aligned end.
        end: u64,
        /// The arena size.
        arena: u64,
    },
    /// A declared in-place or alias pair is not at one offset, or names an unknown id.
    #[error("tensor {id}: takes the memory of {of}, which is not at its offset")]
    Share {
        /// The tensor.
        id: u64,
        /// The id it claims to share.
        of: u64,
    },
    /// Two tensors live at the same step overlap in memory, and do not share by declaration.
    #[error("tensors {a} and {b} are both live at step {step} and overlap in memory")]
    Overlap {
        /// One tensor.
        a: u64,
        /// The other.
        b: u64,
        /// A step where both are live.
        step: u32,
    },
}

impl Plan {
    /// The placement of tensor `id`.
    pub fn placement(&self, id: u64) -> Option<&Placement> {
        self.placements.iter().find(|p| p.id == id)
    }

    /// Arena ÷ lower bound (1.0 is optimal; 1.0 for an empty plan).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound.bytes == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.lower_bound.bytes as f64
        }
    }

    /// Checks the plan against `tensors` without trusting any planner: one placement per
    /// tensor in order, alignment, fixed offsets honoured, every tensor inside the arena,
    /// declared sharing at one offset, and no two tensors live at the same step overlapping in
    /// memory unless they share memory by declaration (a chain of `inplace_of`).
    ///
    /// # Errors
    ///
    /// The first violation found.
    pub fn validate(&self, tensors: &[Tensor]) -> Result<(), Invalid> {
        let align = self.align.max(1);
        if self.placements.len() != tensors.len() {
            let index = self.placements.len().min(tensors.len());
            return Err(Invalid::Mismatch {
                index,
                expected: tensors.get(index).map_or(u64::MAX, |t| t.id),
                found: self.placements.get(index).map(|p| p.id),
            });
        }
        let mut ends = Vec::with_capacity(tensors.len());
        let mut position: HashMap<u64, usize> = HashMap::with_capacity(tensors.len());
        for (index, (t, p)) in tensors.iter().zip(&self.placements).enumerate() {
            if p.id != t.id || p.bytes != t.bytes {
                return Err(Invalid::Mismatch {
                    index,
                    expected: t.id,
                    found: Some(p.id),
                });
            }
            if p.offset % align != 0 {
                return Err(Invalid::Misaligned {
                    id: t.id,
                    offset: p.offset,
                    align,
                });
            }
            if let Some(fixed) = t.offset {
                if fixed != p.offset {
                    return Err(Invalid::FixedMoved {
                        id: t.id,
                        offset: p.offset,
                        fixed,
                    });
                }
            }
            let end = align_up(t.bytes, align)
                .and_then(|s| p.offset.checked_add(s))
                .unwrap_or(u64::MAX);
            if end > self.arena_bytes {
                return Err(Invalid::OutsideArena {
                    id: t.id,
                    offset: p.offset,
                    end,
                    arena: self.arena_bytes,
                });
            }
            ends.push(end);
            position.insert(t.id, index);
        }
        // Declared sharing: at one offset; the root of each chain.
        for (i, p) in self.placements.iter().enumerate() {
            if let Some(of) = p.inplace_of {
                let Some(&j) = position.get(&of) else {
                    return Err(Invalid::Share { id: p.id, of });
                };
                if self.placements[j].offset != p.offset || j == i {
                    return Err(Invalid::Share { id: p.id, of });
                }
            }
        }
        // Each tensor's root: the end of its `inplace_of` chain, each chain walked once (a
        // cycle's members all get the member where the walk met it again).
        const UNKNOWN: usize = usize::MAX;
        const WALKING: usize = usize::MAX - 1;
        let mut root = vec![UNKNOWN; tensors.len()];
        let mut path = Vec::new();
        for i in 0..tensors.len() {
            path.clear();
            let mut r = i;
            let found = loop {
                match root[r] {
                    UNKNOWN => {}
                    WALKING => break r,
                    known => break known,
                }
                root[r] = WALKING;
                path.push(r);
                match self.placements[r]
                    .inplace_of
                    .and_then(|of| position.get(&of))
                {
                    Some(&j) => r = j,
                    None => break r,
                }
            };
            for &p in &path {
                root[p] = found;
            }
        }
        // A sweep in time: tensors by first step; `live` holds those live at the current step
        // by (offset, index). Tensors live together that do not share memory are disjoint, so
        // a new one can only overlap the live ones starting within it, or those at the
        // highest offset below it (a group sharing memory sits at one offset). The cost grows
        // with n log n, not with the pairs of tensors live together.
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| (tensors[i].first, i));
        let mut live: BTreeMap<(u64, usize), ()> = BTreeMap::new();
        let mut ending: BinaryHeap<Reverse<(u32, u64, usize)>> = BinaryHeap::new();
        for &j in &order {
            let t = &tensors[j];
            while let Some(&Reverse((last, offset, i))) = ending.peek() {
                if last >= t.first {
                    break;
                }
                ending.pop();
                live.remove(&(offset, i));
            }
            let offset = self.placements[j].offset;
            let below = live.range(..(offset, 0)).next_back().map(|(&(o, _), ())| o);
            let under = below
                .into_iter()
                .flat_map(|o| live.range((o, 0)..(o, usize::MAX)));
            let within = live.range((offset, 0)..(ends[j], 0));
            for (&(other_offset, i), ()) in under.chain(within) {
                if other_offset < ends[j] && offset < ends[i] && root[i] != root[j] {
                    return Err(Invalid::Overlap {
                        a: tensors[i].id,
                        b: t.id,
                        step: t.first,
                    });
                }
            }
            live.insert((offset, j), ());
            ending.push(Reverse((t.last, offset, j)));
        }
        Ok(())
    }
}
