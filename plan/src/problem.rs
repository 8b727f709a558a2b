//! From tensor records to the planner's problem: validation, alignment, in-place and alias
//! groups, the lower bound and the naive size.

use std::collections::HashMap;

use super::inplace::{self, Share};
use super::{Error, Kind, Tensor};

/// The arena alignment when none is given: what NPU DMA engines want.
pub const DEFAULT_ALIGN: u64 = 256;

/// How to read the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Every offset and size is rounded to this (a power of two).
    pub align: u64,
    /// Let element-wise ops write their output over a dying input (see [`inplace`]).
    pub inplace: bool,
    /// Let aliasing ops (Reshape, ...) share their input's memory.
    pub alias: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            align: DEFAULT_ALIGN,
            inplace: false,
            alias: true,
        }
    }
}

/// The peak of live bytes: no plan's arena can be smaller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct LowerBound {
    /// The largest sum of live (aligned) bytes over all steps, or the end of the highest fixed
    /// tensor if that is larger.
    pub bytes: u64,
    /// A step where the live sum is largest.
    pub step: u32,
}

/// One block of memory to place: a tensor, or a group of tensors sharing memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Item {
    /// Aligned size.
    pub(crate) size: u64,
    /// First step any member is live.
    pub(crate) first: u32,
    /// Last step any member is live.
    pub(crate) last: u32,
    /// A pre-placed offset.
    pub(crate) fixed: Option<u64>,
}

impl Item {
    pub(crate) fn overlaps(&self, other: &Item) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// A validated planning problem: the blocks to place and how tensors map onto them.
#[derive(Debug, Clone)]
pub struct Problem {
    pub(crate) items: Vec<Item>,
    /// For each tensor (input order), its item.
    pub(crate) item_of: Vec<usize>,
    /// For each tensor, the id whose memory it took.
    pub(crate) inplace_of: Vec<Option<u64>>,
    pub(crate) ids: Vec<u64>,
    pub(crate) bytes: Vec<u64>,
    pub(crate) align: u64,
    pub(crate) lower_bound: LowerBound,
    pub(crate) naive: u64,
}

/// Rounds `value` up to `align` (a power of two), `None` on overflow.
pub(crate) fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

impl Problem {
    /// Validates `tensors` and builds the problem.
    ///
    /// # Errors
    ///
    /// Each [`Error`] names the record: a zero size, `first > last`, a duplicate id, an unknown
    /// input id, a misaligned or colliding fixed offset, a sum that overflows, a bad alignment.
    pub fn new(tensors: &[Tensor], options: &Options) -> Result<Self, Error> {
        if tensors.len() > super::MAX_TENSORS {
            return Err(Error::TooManyTensors {
                count: tensors.len(),
                max: super::MAX_TENSORS,
            });
        }
        let align = options.align;
        if align == 0 || !align.is_power_of_two() {
            return Err(Error::Alignment { align });
        }
        let mut index: HashMap<u64, usize> = HashMap::with_capacity(tensors.len());
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut naive: u64 = 0;
        let mut fixed_end: u64 = 0;
        // The tensor ending highest, and the sum of the others' sizes: every planner places
        // blocks at most that sum above the highest fixed end.
        let mut highest: Option<usize> = None;
        let mut free: u64 = 0;
        for (i, t) in tensors.iter().enumerate() {
            if t.bytes == 0 {
                return Err(Error::ZeroSize { tensor: t.label() });
            }
            if t.first > t.last {
                return Err(Error::Interval {
                    tensor: t.label(),
                    first: t.first,
                    last: t.last,
                });
            }
            if index.insert(t.id, i).is_some() {
                return Err(Error::DuplicateId {
                    tensor: t.label(),
                    id: t.id,
                });
            }
            let size = align_up(t.bytes, align).ok_or_else(|| Error::Overflow {
                tensor: t.label(),
                what: "size rounded up to the alignment",
            })?;
            naive = naive.checked_add(size).ok_or_else(|| Error::Overflow {
                tensor: t.label(),
                what: "sum of all sizes",
            })?;
            if let Some(offset) = t.offset {
                if offset % align != 0 {
                    return Err(Error::Misaligned {
                        tensor: t.label(),
                        offset,
                        align,
                    });
                }
                let end = offset.checked_add(size).ok_or_else(|| Error::Overflow {
                    tensor: t.label(),
                    what: "fixed offset plus size",
                })?;
                if end > fixed_end || highest.is_none() {
                    highest = Some(i);
                }
                fixed_end = fixed_end.max(end);
            } else {
                // Cannot overflow: at most `naive`.
                free += size;
            }
            sizes.push(size);
        }
        if let Some(h) = highest {
            fixed_end.checked_add(free).ok_or_else(|| Error::Overflow {
                tensor: tensors[h].label(),
                what: "its fixed end plus the sizes of the tensors without a fixed offset, \
                           which may all be placed above it",
            })?;
        }
        for t in tensors {
            if let Some(&input) = t.inputs.iter().find(|i| !index.contains_key(i)) {
                return Err(Error::UnknownInput {
                    tensor: t.label(),
                    input,
                });
            }
        }
        check_fixed(tensors, &sizes)?;
        let (items, item_of, inplace_of) = group(tensors, &sizes, &index, options);
        let mut lower_bound = peak(&items);
        if fixed_end > lower_bound.bytes {
            lower_bound.bytes = fixed_end;
        }
        Ok(Self {
            items,
            item_of,
            inplace_of,
            ids: tensors.iter().map(|t| t.id).collect(),
            bytes: tensors.iter().map(|t| t.bytes).collect(),
            align,
            lower_bound,
            naive,
        })
    }

    /// The lower bound: the peak of live aligned bytes (after in-place and alias sharing).
    pub fn lower_bound(&self) -> LowerBound {
        self.lower_bound
    }

    /// The naive arena: every tensor in its own aligned range.
    pub fn naive(&self) -> u64 {
        self.naive
    }

    /// The arena alignment.
    pub fn align(&self) -> u64 {
        self.align
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// How many blocks are placed (tensors minus those sharing another's memory).
    pub fn blocks(&self) -> usize {
        self.items.len()
    }
}

/// Refuses pre-placed tensors that are live together and overlap in memory.
fn check_fixed(tensors: &[Tensor], sizes: &[u64]) -> Result<(), Error> {
    let mut fixed: Vec<(usize, u64, u64)> = tensors
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.offset.map(|o| (i, o, o + sizes[i])))
        .collect();
    fixed.sort_by_key(|&(i, o, _)| (o, i));
    for (k, &(i, _, end)) in fixed.iter().enumerate() {
        for &(j, other_offset, _) in &fixed[k + 1..] {
            if other_offset >= end {
                break;
            }
            if tensors[i].overlaps(&tensors[j]) {
                let (a, b) = if i < j { (i, j) } else { (j, i) };
                let offset = tensors[b].offset.unwrap_or(0);
                let end = offset + sizes[b];
                return Err(Error::FixedCollision {
                    tensor: tensors[b].label(),
                    offset,
                    end,
                    other: tensors[a].label(),
                });
            }
        }
    }
    Ok(())
}

/// A group of tensors sharing one block.
#[derive(Debug, Clone, Copy)]
struct Group {
    size: u64,
    first: u32,
    last: u32,
    /// The latest step at which a member is produced.
    latest_first: u32,
    fixed: Option<u64>,
}

/// Merges in-place and alias outputs into their input's group; returns the items, each
/// tensor's item and each tensor's `inplace_of`.
fn group(
    tensors: &[Tensor],
    sizes: &[u64],
    index: &HashMap<u64, usize>,
    options: &Options,
) -> (Vec<Item>, Vec<usize>, Vec<Option<u64>>) {
    let n = tensors.len();
    let mut group_of: Vec<usize> = (0..n).collect();
    let mut groups: Vec<Option<Group>> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Some(Group {
                size: sizes[i],
                first: t.first,
                last: t.last,
                latest_first: t.first,
                fixed: t.offset,
            })
        })
        .collect();
    let mut inplace_of = vec![None; n];
    // Producers before consumers; ties by id, so the result does not depend on input order.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (tensors[i].first, tensors[i].id));
    for &o in &order {
        let out = &tensors[o];
        let Some(share) = share_kind(out, options) else {
            continue;
        };
        let candidates: &[u64] = match share {
            Share::Alias => &out.inputs[..out.inputs.len().min(1)],
            Share::InPlace => &out.inputs,
        };
        for &input in candidates {
            let Some(&x) = index.get(&input) else {
                continue;
            };
            let src = &tensors[x];
            let g = group_of[x];
            let Some(gr) = groups[g] else { continue };
            if x == o || group_of[o] == g || gr.fixed.is_some() {
                continue;
            }
            // The input must be live when the op runs.
            if !(src.first <= out.first && out.first <= src.last) {
                continue;
            }
            let fits = match (share, out.inplace) {
                (Share::InPlace, Some(true)) => out.bytes <= src.bytes,
                _ => out.bytes == src.bytes,
            };
            if !fits {
                continue;
            }
            if share == Share::InPlace
                && (src.kind == Kind::Input || gr.last != out.first || gr.latest_first >= out.first)
            {
                continue;
            }
            let merged = Group {
                size: gr.size.max(sizes[o]),
                first: gr.first.min(out.first),
                last: gr.last.max(out.last),
                latest_first: gr.latest_first.max(out.first),
                fixed: None,
            };
            groups[g] = Some(merged);
            groups[o] = None;
            group_of[o] = g;
            inplace_of[o] = Some(input);
            break;
        }
    }
    let mut item_index = vec![usize::MAX; n];
    let mut items = Vec::new();
    for (g, gr) in groups.iter().enumerate() {
        if let Some(gr) = gr {
            item_index[g] = items.len();
            items.push(Item {
                size: gr.size,
                first: gr.first,
                last: gr.last,
                fixed: gr.fixed,
            });
        }
    }
    let item_of = (0..n).map(|i| item_index[group_of[i]]).collect();
    (items, item_of, inplace_of)
}

/// Whether `out` may share an input's memory, and how.
fn share_kind(out: &Tensor, options: &Options) -> Option<Share> {
    if out.offset.is_some() || out.inputs.is_empty() || out.inplace == Some(false) {
        return None;
    }
    let op = out.op.as_deref().unwrap_or("");
    if options.alias && inplace::is_alias(op) {
        return Some(Share::Alias);
    }
    if options.inplace && (out.inplace == Some(true) || inplace::is_elementwise(op)) {
        return Some(Share::InPlace);
    }
    None
}

/// The largest sum of live sizes over all steps, and a step where it occurs.
pub(crate) fn peak(items: &[Item]) -> LowerBound {
    // (time, +1 add / 0 remove, size): removals at `last + 1` come before additions at the
    // same time.
    let mut events: Vec<(u64, u8, u64)> = Vec::with_capacity(items.len() * 2);
    for it in items {
        events.push((u64::from(it.first), 1, it.size));
        events.push((u64::from(it.last) + 1, 0, it.size));
    }
    events.sort_unstable();
    let mut live: u64 = 0;
    let mut best = LowerBound::default();
    for (time, add, size) in events {
        if add == 1 {
            live += size;
            if live > best.bytes {
                best = LowerBound {
                    bytes: live,
                    step: u32::try_from(time).unwrap_or(u32::MAX),
                };
            }
        } else {
            live -= size;
        }
    }
    best
}
