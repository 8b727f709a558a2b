//! Beyond one model: models that run one after another share one arena, models that run at
//! the same time get disjoint ranges, and a model with dynamic shapes gets a plan per shape
//! bucket, picked at run time without allocating.

use super::arena::Plan;
use super::problem::align_up;
use super::Error;

/// Where each model's plan starts in one shared arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The shared arena's size.
    pub arena_bytes: u64,
    /// Each model's base offset, in the order given: add it to the model's offsets.
    pub bases: Vec<u64>,
}

/// Models that run one after another: each uses the whole arena from offset 0 while it runs,
/// so the arena is the largest of theirs.
pub fn sequential(plans: &[&Plan]) -> Layout {
    Layout {
        arena_bytes: plans.iter().map(|p| p.arena_bytes).max().unwrap_or(0),
        bases: vec![0; plans.len()],
    }
}

/// Models that run at the same time: each gets its own range, one after another, each base
/// aligned to `align` (a power of two).
///
/// # Errors
///
/// [`Error::Alignment`] for a bad alignment, [`Error::Overflow`] naming the model whose range
/// does not fit in 64 bits.
pub fn concurrent(plans: &[&Plan], align: u64) -> Result<Layout, Error> {
    if align == 0 || !align.is_power_of_two() {
        return Err(Error::Alignment { align });
    }
    let mut bases = Vec::with_capacity(plans.len());
    let mut at = 0u64;
    for (k, p) in plans.iter().enumerate() {
        let overflow = || Error::Overflow {
            tensor: format!("model {k}"),
            what: "concurrent arenas",
        };
        let base = align_up(at, align).ok_or_else(overflow)?;
        bases.push(base);
        at = base.checked_add(p.arena_bytes).ok_or_else(overflow)?;
    }
    Ok(Layout {
        arena_bytes: at,
        bases,
    })
}

/// One plan per shape bucket of a model with dynamic shapes (e.g. per batch size or sequence
/// length), all in one arena sized to the largest. [`Buckets::pick`] chooses at run time
/// without allocating.
#[derive(Debug, Clone)]
pub struct Buckets {
    /// Bucket limits, strictly increasing.
    limits: Vec<u64>,
    plans: Vec<Plan>,
    arena_bytes: u64,
}

/// Why [`Buckets::new`] refused its buckets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// No buckets.
    #[error("no shape buckets")]
    Empty,
    /// Two buckets have the same limit.
    #[error("shape bucket {limit} is given twice")]
    Duplicate {
        /// The limit.
        limit: u64,
    },
}

impl Buckets {
    /// Buckets from `(limit, plan)` pairs: a plan serves every shape up to its limit (and above
    /// the previous bucket's).
    ///
    /// # Errors
    ///
    /// No buckets, or a limit given twice.
    pub fn new(mut buckets: Vec<(u64, Plan)>) -> Result<Self, BucketError> {
        if buckets.is_empty() {
            return Err(BucketError::Empty);
        }
        buckets.sort_by_key(|b| b.0);
        if let Some(w) = buckets.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(BucketError::Duplicate { limit: w[0].0 });
        }
        let arena_bytes = buckets.iter().map(|b| b.1.arena_bytes).max().unwrap_or(0);
        let (limits, plans) = buckets.into_iter().unzip();
        Ok(Self {
            limits,
            plans,
            arena_bytes,
        })
    }

    /// The plan for a run of shape `size`: the smallest bucket whose limit is at least `size`,
    /// or `None` above the largest. Allocates nothing.
    pub fn pick(&self, size: u64) -> Option<&Plan> {
        let k = self.limits.partition_point(|&l| l < size);
        self.plans.get(k)
    }

    /// The one arena every bucket's plan fits in.
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }

    /// How many buckets.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Never true (a `Buckets` has at least one).
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{plan, Budget, Options, Strategy, Tensor};
    use super::*;

    fn model(bytes: u64) -> Plan {
        let t = [Tensor::new(0, bytes, 0, 1), Tensor::new(1, bytes, 1, 2)];
        plan(
            &t,
            &Options::default(),
            Strategy::GreedySize,
            Budget::Nodes(0),
        )
        .unwrap()
    }

    #[test]
    fn sequential_models_share_the_largest_arena() {
        let (a, b) = (model(1000), model(3000));
        let l = sequential(&[&a, &b]);
        assert_eq!(l.arena_bytes, b.arena_bytes);
        assert_eq!(l.bases, [0, 0]);
    }

    #[test]
    fn concurrent_models_get_disjoint_ranges() {
        let (a, b) = (model(1000), model(3000));
        let l = concurrent(&[&a, &b], 4096).unwrap();
        assert_eq!(l.bases, [0, 4096]);
        assert_eq!(l.arena_bytes, 4096 + b.arena_bytes);
        assert!(matches!(
            concurrent(&[&a], 3),
            Err(Error::Alignment { align: 3 })
        ));
        let mut huge = model(1);
        huge.arena_bytes = u64::MAX;
        assert!(matches!(
            concurrent(&[&a, &huge], 256),
            Err(Error::Overflow { .. })
        ));
    }

    #[test]
    fn buckets_pick_the_smallest_that_fits() {
        let b = Buckets::new(vec![(8, model(8000)), (1, model(1000)), (4, model(4000))]).unwrap();
        assert_eq!(b.pick(1).unwrap().naive_bytes, model(1000).naive_bytes);
        assert_eq!(b.pick(2).unwrap().naive_bytes, model(4000).naive_bytes);
        assert_eq!(b.pick(8).unwrap().naive_bytes, model(8000).naive_bytes);
        assert!(b.pick(9).is_none());
        assert_eq!(b.arena_bytes(), model(8000).arena_bytes);
        assert_eq!(Buckets::new(vec![]).unwrap_err(), BucketError::Empty);
        assert_eq!(
            Buckets::new(vec![(2, model(1)), (2, model(2))]).unwrap_err(),
            BucketError::Duplicate { limit: 2 }
        );
    }
}
