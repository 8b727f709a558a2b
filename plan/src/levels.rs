//! Two memory levels: which tensors live in the device's on-chip SRAM and which in DRAM.
//!
//! A tensor is *touched* at the step that produces it, at each step whose op lists it as an
//! input, and at its last step (its last read). The goal is to keep as many touched bytes in
//! SRAM as fit: tensors are taken in decreasing touched bytes per byte-step of SRAM they
//! occupy (ties by id), each placed in SRAM at the lowest offset free among the SRAM tensors
//! that overlap it in time, and kept there only if it ends within the SRAM size. Greedy, so
//! not optimal; the share it reaches is reported. DRAM tensors keep their offsets in the
//! model's [`Plan`](super::Plan).

use std::collections::{BTreeSet, HashMap};

use super::problem::align_up;
use super::{Error, Tensor};

/// Which tensors live in SRAM, and at which SRAM offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// Per tensor (input order): its SRAM offset, or `None` for DRAM.
    pub sram: Vec<Option<u64>>,
    /// The SRAM the placed tensors use (at most the size given).
    pub sram_used: u64,
    /// Bytes touched over all steps.
    pub touched_bytes: u64,
    /// Of those, bytes touched in SRAM.
    pub sram_touched_bytes: u64,
}

impl Levels {
    /// The share of touched bytes that are in SRAM (1.0 when nothing is touched).
    pub fn share(&self) -> f64 {
        if self.touched_bytes == 0 {
            1.0
        } else {
            self.sram_touched_bytes as f64 / self.touched_bytes as f64
        }
    }
}

/// Splits `tensors` between an SRAM of `sram_bytes` and DRAM, with offsets aligned to `align`.
///
/// # Errors
///
/// [`Error::Alignment`] for a bad alignment, and the input errors of
/// [`Problem::new`](super::Problem::new) (zero sizes, bad intervals, ...).
pub fn split(tensors: &[Tensor], sram_bytes: u64, align: u64) -> Result<Levels, Error> {
    // Validates the records (and the alignment) the same way the planner does.
    super::Problem::new(
        tensors,
        &super::Options {
            align,
            inplace: false,
            alias: false,
        },
    )?;
    let index: HashMap<u64, usize> = tensors.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
    let mut touches: Vec<BTreeSet<u32>> = tensors
        .iter()
        .map(|t| BTreeSet::from([t.first, t.last]))
        .collect();
    for t in tensors {
        for input in &t.inputs {
            if let Some(&j) = index.get(input) {
                touches[j].insert(t.first);
            }
        }
    }
    let value: Vec<u64> = tensors
        .iter()
        .zip(&touches)
        .map(|(t, s)| t.bytes.saturating_mul(s.len() as u64))
        .collect();
    let touched_bytes = value.iter().fold(0u64, |a, &v| a.saturating_add(v));
    let sizes: Vec<u64> = tensors
        .iter()
        .map(|t| align_up(t.bytes, align).unwrap_or(u64::MAX))
        .collect();
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    // Decreasing value per byte-step: value / (size * steps), compared by cross-multiplying.
    let cost = |i: usize| u128::from(sizes[i]) * u128::from(tensors[i].last - tensors[i].first + 1);
    order.sort_by(|&a, &b| {
        (u128::from(value[b]) * cost(a))
            .cmp(&(u128::from(value[a]) * cost(b)))
            .then(tensors[a].id.cmp(&tensors[b].id))
    });
    let mut sram = vec![None; tensors.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut used = 0u64;
    let mut in_sram = 0u64;
    for i in order {
        let t = &tensors[i];
        if sizes[i] > sram_bytes {
            continue;
        }
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| tensors[j].overlaps(t))
            .filter_map(|&j| sram[j].map(|o: u64| (o, o + sizes[j])))
            .collect();
        busy.sort_unstable();
        let mut at = 0u64;
        for (o, e) in busy {
            if o >= at.saturating_add(sizes[i]) {
                break;
            }
            at = at.max(e);
        }
        let end = at.saturating_add(sizes[i]);
        if end <= sram_bytes {
            sram[i] = Some(at);
            placed.push(i);
            used = used.max(end);
            in_sram = in_sram.saturating_add(value[i]);
        }
    }
    Ok(Levels {
        sram,
        sram_used: used,
        touched_bytes,
        sram_touched_bytes: in_sram,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_small_tensors_go_to_sram() {
        let tensors = vec![
            Tensor::new(0, 4096, 0, 9),
            Tensor::new(1, 1024, 1, 2).op("Conv", [0]),
            Tensor::new(2, 1024, 2, 3).op("Relu", [1]),
            Tensor::new(3, 1024, 3, 4).op("Relu", [2]),
        ];
        let l = split(&tensors, 2048, 256).unwrap();
        assert_eq!(l.sram[0], None);
        assert!(l.sram[1].is_some() && l.sram[2].is_some() && l.sram[3].is_some());
        assert!(l.sram_used <= 2048);
        assert!(l.share() > 0.0 && l.share() < 1.0);
        // No two SRAM tensors live together overlap.
        let all = split(&tensors, 1 << 20, 256).unwrap();
        assert_eq!(all.share(), 1.0);
        let none = split(&tensors, 0, 256).unwrap();
        assert_eq!(none.sram_touched_bytes, 0);
        assert!(split(&tensors, 1024, 3).is_err());
    }
}
