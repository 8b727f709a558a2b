//! One decision search of the exact strategy ([`Search`]): does every block fit below a
//! capacity? A depth-first search over canonical placements with dominance, cross-section
//! inference, hatless pruning and dynamic decomposition (see the [parent module](super)).

use std::time::Instant;

use super::shape::Shape;
use crate::problem::Item;

const NONE: u64 = u64::MAX;
/// No block (a section with no hint).
const EMPTY: usize = usize::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Found,
    NotFound,
    Aborted,
}

/// One decision search: a capacity, a preorder heuristic, a node limit.
#[derive(Debug)]
pub(super) struct Search<'a> {
    items: &'a [Item],
    shape: &'a Shape,
    capacity: u64,
    /// Which preorder (0: width, area, total; 1: total, area, width; 2: total, width, area).
    heuristic: usize,
    offset: Vec<u64>,
    pub(super) solution: Vec<u64>,
    min_offset: Vec<u64>,
    /// `min_offset` of unplaced blocks, `NONE` for placed ones: one load per block in a rescan.
    live: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// Unplaced blocks crossing the boundary between section `s` and `s + 1`.
    cuts: Vec<u32>,
    undo_min: Vec<(usize, u64)>,
    undo_floor: Vec<(usize, u64)>,
    /// Per section, the unplaced block a scan last found low enough for the section's unplaced
    /// blocks to fit above it: tried first next time. Only a hint (any such block settles the
    /// question), so it is not undone.
    hint: Vec<usize>,
    /// Candidate buffers, one per depth, reused so the search does not allocate per node.
    spare: Vec<Vec<(u64, usize)>>,
    pub(super) nodes: u64,
    limit: u64,
    deadline: Option<Instant>,
    pub(super) deadline_hit: bool,
}

impl<'a> Search<'a> {
    pub(super) fn new(
        items: &'a [Item],
        shape: &'a Shape,
        heuristic: usize,
        capacity: u64,
        limit: u64,
        deadline: Option<Instant>,
    ) -> Self {
        let sections = shape.totals.len();
        let mut cuts = vec![0u32; sections.saturating_sub(1)];
        for i in 0..items.len() {
            for c in &mut cuts[shape.sec_lo[i]..shape.sec_hi[i] - 1] {
                *c += 1;
            }
        }
        Self {
            items,
            shape,
            capacity,
            heuristic,
            offset: vec![NONE; items.len()],
            solution: vec![NONE; items.len()],
            min_offset: (0..items.len())
                .map(|i| shape.clear_of_fixed(i, 0))
                .collect(),
            live: (0..items.len())
                .map(|i| shape.clear_of_fixed(i, 0))
                .collect(),
            floor: vec![0; sections],
            total: shape.totals.clone(),
            cuts,
            undo_min: Vec::new(),
            undo_floor: Vec::new(),
            hint: shape
                .section_items
                .iter()
                .map(|v| v.first().copied().unwrap_or(EMPTY))
                .collect(),
            spare: Vec::new(),
            nodes: 0,
            limit,
            deadline,
            deadline_hit: false,
        }
    }

    pub(super) fn run(&mut self) -> Status {
        let sections = self.shape.totals.len();
        if !self.check((0, sections), 0) {
            return Status::NotFound;
        }
        let mut cutpoints = vec![0];
        cutpoints.extend(
            (0..self.cuts.len())
                .filter(|&s| self.cuts[s] == 0)
                .map(|s| s + 1),
        );
        cutpoints.push(sections);
        // A loop over an explicit stack of frames, not recursion: the search goes one level
        // deeper per block placed, which would overflow a thread's stack at some thousands of
        // blocks. `parts[0]` is every block; each split pushes the preorder of the range it is
        // solving and pops it when that range has its answer.
        let mut parts: Vec<Vec<usize>> = vec![(0..self.items.len()).collect()];
        let mut frames = vec![Frame::Split(Split {
            part: 0,
            cutpoints,
            next: 0,
        })];
        // The answer of the frame popped last, for the frame below it.
        let mut returned = None;
        while let Some(frame) = frames.last_mut() {
            let call = match frame {
                Frame::Split(split) => self.resume_split(split, &mut parts, returned.take()),
                Frame::Node(node) => self.resume_node(node, &parts, returned.take()),
            };
            match call {
                Call::Push(frame) => frames.push(frame),
                Call::Return(status) => {
                    if let Some(Frame::Node(node)) = frames.pop() {
                        self.spare.push(node.candidates);
                    }
                    returned = Some(status);
                }
            }
        }
        returned.unwrap_or(Status::Found)
    }

    /// Goes on with a split: the unplaced blocks of `split.part` in each range between
    /// consecutive cutpoints are solved independently, one range after the other. `returned`
    /// is the answer for the range started last.
    fn resume_split(
        &mut self,
        split: &mut Split,
        parts: &mut Vec<Vec<usize>>,
        mut returned: Option<Status>,
    ) -> Call {
        loop {
            if let Some(status) = returned.take() {
                parts.pop();
                if status != Status::Found {
                    return Call::Return(status);
                }
            }
            let Some(&[a, b]) = split.cutpoints.get(split.next..split.next + 2) else {
                return Call::Return(Status::Found);
            };
            split.next += 1;
            let sub: Vec<usize> = parts[split.part]
                .iter()
                .copied()
                .filter(|&j| {
                    self.offset[j] == NONE && self.shape.sec_lo[j] < b && a < self.shape.sec_hi[j]
                })
                .collect();
            if sub.is_empty() {
                continue;
            }
            parts.push(self.preorder(sub));
            let part = parts.len() - 1;
            match self.enter(&parts[part], part, (a, b), 0, 0) {
                Ok(node) => return Call::Push(Frame::Node(node)),
                Err(status) => returned = Some(status),
            }
        }
    }

    /// A static preorder of `blocks` (MiniMalloc's letters: W lifetime width, A area, T the
    /// largest section total it spans).
    fn preorder(&self, mut blocks: Vec<usize>) -> Vec<usize> {
        let items = self.items;
        let shape = self.shape;
        let total = |i: usize| {
            (shape.sec_lo[i]..shape.sec_hi[i])
                .map(|s| self.total[s])
                .max()
                .unwrap_or(0)
        };
        let key = |i: usize| {
            let w = u128::from(items[i].last - items[i].first + 1);
            let a = u128::from(items[i].size) * w;
            let t = u128::from(total(i));
            let (k0, k1, k2) = match self.heuristic {
                0 => (w, a, t),
                1 => (t, a, w),
                _ => (t, w, a),
            };
            (
                std::cmp::Reverse(k0),
                std::cmp::Reverse(k1),
                std::cmp::Reverse(k2),
                i,
            )
        };
        blocks.sort_by_cached_key(|&i| key(i));
        blocks
    }

    /// Cross-section inference over the sections of `range`, with `offset` the offset of the
    /// last placement (every later one is at or above it).
    fn check(&mut self, range: (usize, usize), offset: u64) -> bool {
        (range.0..range.1).all(|s| self.section_fits(s, offset))
    }

    /// Whether the unplaced blocks of section `s` can still stack below the capacity: above the
    /// placed blocks and `offset`, and above the least minimal offset among them. The least is
    /// not kept up to date: a section passes as soon as one unplaced block sits low enough (its
    /// hint first), so a full scan runs only when the hint has been placed or has risen too high.
    fn section_fits(&mut self, s: usize, offset: u64) -> bool {
        let total = self.total[s];
        if total == 0 {
            return true;
        }
        let Some(room) = self.capacity.checked_sub(total) else {
            return false;
        };
        if self.floor[s].max(offset) > room {
            return false;
        }
        // `live` is NONE for a placed block, which is never at or below `room`.
        if self.live.get(self.hint[s]).is_some_and(|&m| m <= room) {
            return true;
        }
        match self.shape.section_items[s]
            .iter()
            .copied()
            .find(|&j| self.live[j] <= room)
        {
            Some(j) => {
                self.hint[s] = j;
                true
            }
            None => false,
        }
    }

    /// Enters a search node over the blocks `pre` (`parts[part]`): counts it against the
    /// limits and collects the blocks that may go next. `Err` is an answer reached without
    /// trying any: every block placed, nothing fits, or a limit reached.
    fn enter(
        &mut self,
        pre: &[usize],
        part: usize,
        range: (usize, usize),
        last_offset: u64,
        last_rank: usize,
    ) -> Result<Node, Status> {
        self.nodes += 1;
        if self.nodes > self.limit {
            return Err(Status::Aborted);
        }
        if self.nodes % 256 == 0 {
            if let Some(d) = self.deadline {
                if Instant::now() >= d {
                    self.deadline_hit = true;
                    return Err(Status::Aborted);
                }
            }
        }
        // One pass: the least height any unplaced block can reach, and the blocks that may go
        // next (canonical: non-decreasing offsets, ties in preorder; below the capacity).
        let mut candidates = self.spare.pop().unwrap_or_default();
        candidates.clear();
        let mut min_height = NONE;
        let size = &self.shape.size;
        for (r, &i) in pre.iter().enumerate() {
            let offset = self.live[i];
            if offset == NONE {
                continue;
            }
            let height = offset + size[i];
            min_height = min_height.min(height);
            if (offset > last_offset || (offset == last_offset && r >= last_rank))
                && height <= self.capacity
            {
                candidates.push((offset, r));
            }
        }
        if min_height == NONE {
            self.spare.push(candidates);
            return Err(Status::Found);
        }
        // Every later placement is at or above the next one's offset, so every section's
        // unplaced blocks stack above it: an offset above `cap - the largest unplaced total`
        // fails, and so does every candidate after it (sorted by offset). This also covers the
        // sections under the placed block (its top plus their remaining total is the same sum).
        let largest = self.total[range.0..range.1]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let Some(highest) = self.capacity.checked_sub(largest) else {
            self.spare.push(candidates);
            return Err(Status::NotFound);
        };
        // Dominance: a block at or above `min_height` leaves a gap another block fills.
        candidates.retain(|&(offset, _)| offset < min_height);
        // Only the candidates that can be tried are sorted.
        candidates.sort_unstable();
        Ok(Node {
            part,
            range,
            candidates,
            next: 0,
            highest,
            trying: None,
        })
    }

    /// Goes on with a node: tries each candidate `(minimal offset, rank)` in turn, in sorted
    /// order. `returned` is the answer for the try in progress.
    fn resume_node(
        &mut self,
        node: &mut Node,
        parts: &[Vec<usize>],
        mut returned: Option<Status>,
    ) -> Call {
        let pre = &parts[node.part];
        loop {
            if let Some(status) = returned.take() {
                let Some(Try {
                    block: i,
                    marks,
                    decomposed,
                }) = node.trying.take()
                else {
                    // Only a try's search answers a node; this cannot happen.
                    return Call::Return(status);
                };
                if decomposed {
                    let (lo, hi) = (self.shape.sec_lo[i], self.shape.sec_hi[i]);
                    for c in &mut self.cuts[lo..hi - 1] {
                        *c += 1;
                    }
                }
                self.unplace(i, marks);
                if status != Status::NotFound {
                    return Call::Return(status);
                }
                // Nothing unplaced overlaps it: if the rest fails with it here, it fails with
                // any other candidate first, too ("hatless" pruning). Asked only on failure,
                // after the undo, when the same blocks as during the try are placed but for
                // `i` itself.
                if self.shape.overlaps[i].iter().all(|&j| self.live[j] == NONE) {
                    return Call::Return(status);
                }
            }
            let Some(&(offset, r)) = node.candidates.get(node.next) else {
                return Call::Return(Status::NotFound);
            };
            if offset > node.highest {
                return Call::Return(Status::NotFound);
            }
            node.next += 1;
            let i = pre[r];
            let marks = (self.undo_min.len(), self.undo_floor.len());
            let changed = self.place(i, offset);
            let (lo, hi) = (changed.0.max(node.range.0), changed.1.min(node.range.1));
            // Only the sections whose blocks moved or left can have stopped fitting.
            if !(lo..hi).all(|s| self.section_fits(s, offset)) {
                node.trying = Some(Try {
                    block: i,
                    marks,
                    decomposed: false,
                });
                returned = Some(Status::NotFound);
                continue;
            }
            node.trying = Some(Try {
                block: i,
                marks,
                decomposed: true,
            });
            // Dynamic decomposition: where no unplaced block crosses a section boundary any
            // more, the two sides are independent problems, each solved on its own.
            self.solution[i] = offset;
            let (lo, hi) = (self.shape.sec_lo[i], self.shape.sec_hi[i]);
            let mut cut = false;
            for c in &mut self.cuts[lo..hi - 1] {
                *c -= 1;
                cut |= *c == 0;
            }
            // Most nodes cut nothing: only those that do build the list of cutpoints.
            if cut {
                let mut cutpoints = vec![node.range.0];
                cutpoints.extend((lo..hi - 1).filter(|&s| self.cuts[s] == 0).map(|s| s + 1));
                cutpoints.push(node.range.1);
                return Call::Push(Frame::Split(Split {
                    part: node.part,
                    cutpoints,
                    next: 0,
                }));
            }
            match self.enter(pre, node.part, node.range, offset, r) {
                Ok(child) => return Call::Push(Frame::Node(child)),
                Err(status) => returned = Some(status),
            }
        }
    }

    /// Places `i` at `offset`. Returns a range of sections holding every section whose unplaced
    /// blocks changed (it left, or their minimal offsets rose).
    fn place(&mut self, i: usize, offset: u64) -> (usize, usize) {
        let shape = self.shape;
        let size = self.items[i].size;
        let height = offset + size;
        self.offset[i] = offset;
        self.live[i] = NONE;
        let (mut lo, mut hi) = (shape.sec_lo[i], shape.sec_hi[i]);
        for &j in &shape.overlaps[i] {
            // `live` is NONE for a placed block.
            if self.live[j] < height {
                let m = if shape.obstacles[j].is_empty() {
                    height
                } else {
                    shape.clear_of_fixed(j, height)
                };
                self.undo_min.push((j, self.min_offset[j]));
                self.min_offset[j] = m;
                self.live[j] = m;
                lo = lo.min(shape.sec_lo[j]);
                hi = hi.max(shape.sec_hi[j]);
            }
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.undo_floor.push((s, self.floor[s]));
            self.floor[s] = height;
            self.total[s] -= size;
        }
        (lo, hi)
    }

    fn unplace(&mut self, i: usize, marks: (usize, usize)) {
        let shape = self.shape;
        let size = self.items[i].size;
        let (min_mark, floor_mark) = marks;
        while self.undo_floor.len() > floor_mark {
            let (s, f) = self.undo_floor.pop().expect("non-empty");
            self.floor[s] = f;
        }
        while self.undo_min.len() > min_mark {
            let (j, m) = self.undo_min.pop().expect("non-empty");
            self.min_offset[j] = m;
            self.live[j] = m;
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.total[s] += size;
        }
        self.offset[i] = NONE;
        self.live[i] = self.min_offset[i];
    }
}

/// One level of the search on the explicit stack.
#[derive(Debug)]
enum Frame {
    Split(Split),
    Node(Node),
}

/// What a frame asks of the loop that runs the stack.
#[derive(Debug)]
enum Call {
    /// Run this frame on top, then give its answer back.
    Push(Frame),
    /// This frame is done, with this answer.
    Return(Status),
}

/// Independent ranges of sections, solved one after the other.
#[derive(Debug)]
struct Split {
    /// The blocks to split (an index into the stack's preorders).
    part: usize,
    cutpoints: Vec<usize>,
    /// The window of `cutpoints` to solve next.
    next: usize,
}

/// A node: its candidates `(minimal offset, rank)`, sorted, and the one being tried.
#[derive(Debug)]
struct Node {
    /// Its blocks in preorder (an index into the stack's preorders).
    part: usize,
    range: (usize, usize),
    candidates: Vec<(u64, usize)>,
    next: usize,
    /// No candidate above this offset can fit.
    highest: u64,
    trying: Option<Try>,
}

/// The candidate placed for the try in progress.
#[derive(Debug, Clone, Copy)]
struct Try {
    block: usize,
    /// The undo logs' lengths before it was placed.
    marks: (usize, usize),
    /// It passed the section check: its solution is set and the cuts it crossed lowered.
    decomposed: bool,
}
