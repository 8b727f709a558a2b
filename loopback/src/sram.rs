//! The device SRAM of the cost model: which contexts' working sets are resident, how much of a
//! compute descriptor's traffic they serve, and what a miss loads (see the cost module's docs
//! for the model). Pure bookkeeping, no allocation after construction.

use super::regs::MAX_QUEUES;

/// A queue's declared working set (its `ws_private`, `ws_shared` and `share_key` registers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct WorkingSet {
    /// The queue, which owns the private part.
    pub(super) queue: u16,
    /// Bytes only this queue's context uses.
    pub(super) private: u64,
    /// Bytes shared with the queues of the same key (a key of 0 makes them private).
    pub(super) shared: u64,
    /// The share key.
    pub(super) key: u32,
}

impl WorkingSet {
    /// Whether the queue declared nothing (the model leaves it alone).
    pub(super) fn is_empty(&self) -> bool {
        self.private == 0 && self.shared == 0
    }

    /// The two parts as `(entry key, bytes)`: the private part keyed by the queue, the shared
    /// part by its share key (folded into the private part when the key is 0).
    fn parts(&self) -> [(u64, u64); 2] {
        let private = (PRIVATE | u64::from(self.queue), self.private);
        if self.key == 0 {
            [
                (private.0, self.private.saturating_add(self.shared)),
                (0, 0),
            ]
        } else {
            [private, (SHARED | u64::from(self.key), self.shared)]
        }
    }
}

const PRIVATE: u64 = 1 << 32;
const SHARED: u64 = 2 << 32;

/// One working-set part resident (in part) in SRAM.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    /// `PRIVATE | queue` or `SHARED | key`; 0: a free entry.
    key: u64,
    /// Bytes of it resident.
    resident: u64,
    /// When it was last used (the SRAM's own counter), for least-recently-used eviction.
    used: u64,
}

/// What one compute descriptor found in SRAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Touch {
    /// Bytes served from SRAM.
    pub(super) hits: u64,
    /// Bytes read at the DRAM rate (and loaded into SRAM).
    pub(super) missed: u64,
}

/// The SRAM: up to two parts per queue resident.
#[derive(Debug)]
pub(super) struct Sram {
    capacity: u64,
    entries: [Entry; 2 * MAX_QUEUES as usize],
    clock: u64,
}

impl Sram {
    /// An empty SRAM of `capacity` bytes (0: no SRAM modelled).
    pub(super) fn new(capacity: u64) -> Sram {
        Sram {
            capacity,
            entries: [Entry::default(); 2 * MAX_QUEUES as usize],
            clock: 0,
        }
    }

    /// Forgets everything resident (a device reset).
    pub(super) fn clear(&mut self) {
        self.entries = [Entry::default(); 2 * MAX_QUEUES as usize];
    }

    /// Bytes resident of all working sets.
    fn used(&self) -> u64 {
        self.entries.iter().map(|e| e.resident).sum()
    }

    fn find(&self, key: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.key == key && key != 0)
    }

    fn resident(&self, key: u64) -> u64 {
        self.find(key).map_or(0, |i| self.entries[i].resident)
    }

    /// A compute descriptor of the context with working set `ws` touching `bytes`: while what
    /// SRAM can hold of `ws` is not all resident, touched bytes are misses that load it
    /// (evicting the least recently used other parts to make room); after that they hit,
    /// except for the share of a working set larger than SRAM that never fits. `None` when
    /// the model does not apply (no SRAM, or nothing declared).
    pub(super) fn touch(&mut self, ws: WorkingSet, bytes: u64) -> Option<Touch> {
        if self.capacity == 0 || ws.is_empty() {
            return None;
        }
        self.clock += 1;
        let parts = ws.parts();
        let total: u64 = parts.iter().map(|p| p.1).sum();
        let resident: [u64; 2] = parts.map(|(key, _)| self.resident(key));
        let have: u64 = resident.iter().sum::<u64>().min(total);
        // What of the working set SRAM can hold, and what of that is missing: touched bytes
        // refill it first (a layer sweeps its working set), all of them misses. Beyond that,
        // the part of a working set larger than SRAM is never resident: that share of the
        // remaining bytes misses every time.
        let fits = total.min(self.capacity);
        let refill = bytes.min(fits.saturating_sub(have));
        let rest = bytes - refill;
        let never = (u128::from(rest) * u128::from(total - fits) / u128::from(total)) as u64;
        let missed = refill + never;
        let hits = bytes - missed;
        // The refill goes to the parts in proportion to what each lacks.
        let lack = [
            parts[0].1 - resident[0].min(parts[0].1),
            parts[1].1 - resident[1].min(parts[1].1),
        ];
        let lacking: u64 = lack.iter().sum();
        let mut load = [0u64; 2];
        if lacking > 0 {
            load[0] = (u128::from(refill) * u128::from(lack[0]) / u128::from(lacking)) as u64;
            load[1] = (refill - load[0]).min(lack[1]);
        }
        let mine = [parts[0].0, parts[1].0];
        for (k, (&(key, _), &add)) in parts.iter().zip(&load).enumerate() {
            if key == 0 {
                continue;
            }
            let slot = match self.find(key) {
                Some(i) => i,
                None => match self.entries.iter().position(|e| e.key == 0) {
                    Some(i) => {
                        self.entries[i] = Entry {
                            key,
                            resident: 0,
                            used: 0,
                        };
                        i
                    }
                    // Every entry taken (more parts than the register map has queues for
                    // cannot happen): the part stays out.
                    None => continue,
                },
            };
            let e = &mut self.entries[slot];
            e.resident = (resident[k] + add).min(self.capacity);
            e.used = self.clock;
        }
        self.make_room(mine);
        Some(Touch { hits, missed })
    }

    /// Evicts least recently used parts other than `keep` until everything fits; if `keep`
    /// alone is too big, trims it (its own working set exceeds SRAM).
    fn make_room(&mut self, keep: [u64; 2]) {
        let mut over = self.used().saturating_sub(self.capacity);
        while over > 0 {
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.key != 0 && e.resident > 0 && !keep.contains(&e.key))
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i);
            let Some(i) = victim.or_else(|| {
                self.entries
                    .iter()
                    .position(|e| e.key != 0 && e.resident > 0)
            }) else {
                return;
            };
            let take = over.min(self.entries[i].resident);
            self.entries[i].resident -= take;
            over -= take;
            if self.entries[i].resident == 0 {
                self.entries[i] = Entry::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ws(queue: u16, private: u64) -> WorkingSet {
        WorkingSet {
            queue,
            private,
            shared: 0,
            key: 0,
        }
    }

    #[test]
    fn a_cold_context_misses_then_runs_from_sram() {
        let mut sram = Sram::new(8 * MIB);
        let a = ws(0, 4 * MIB);
        // 4 MiB to load: the first four MiB touched miss, then everything hits.
        for _ in 0..4 {
            assert_eq!(
                sram.touch(a, MIB),
                Some(Touch {
                    hits: 0,
                    missed: MIB
                })
            );
        }
        assert_eq!(
            sram.touch(a, MIB),
            Some(Touch {
                hits: MIB,
                missed: 0
            })
        );
        // Part of a touch can finish the refill.
        let mut half = Sram::new(8 * MIB);
        half.touch(a, 3 * MIB + MIB / 2);
        assert_eq!(
            half.touch(a, MIB),
            Some(Touch {
                hits: MIB / 2,
                missed: MIB / 2
            })
        );
        assert_eq!(sram.used(), 4 * MIB);
    }

    #[test]
    fn a_switch_evicts_the_other_context_and_a_big_working_set_caps_the_hit_rate() {
        let mut sram = Sram::new(8 * MIB);
        let (a, b) = (ws(0, 6 * MIB), ws(1, 6 * MIB));
        for _ in 0..20 {
            sram.touch(a, MIB);
        }
        assert_eq!(sram.resident(PRIVATE), 6 * MIB);
        for _ in 0..20 {
            sram.touch(b, MIB);
        }
        // B took what it needed from A, the least recently used.
        assert_eq!(sram.resident(PRIVATE | 1), 6 * MIB);
        assert_eq!(sram.resident(PRIVATE), 2 * MIB);
        // A has 2 of its 6 MiB: the next 4 MiB it touches miss.
        let t = sram.touch(a, 5 * MIB).unwrap();
        assert_eq!((t.hits, t.missed), (MIB, 4 * MIB));
        assert!(sram.used() <= 8 * MIB);
        // 10 MiB on 8 MiB: once 8 MiB are in, 20 % of every touch misses.
        let mut big = Sram::new(8 * MIB);
        let c = ws(2, 10 * MIB);
        for _ in 0..50 {
            big.touch(c, MIB);
        }
        let t = big.touch(c, 10 * MIB).unwrap();
        assert_eq!(t.hits, 8 * MIB);
    }

    #[test]
    fn shared_weights_survive_a_switch_between_their_users() {
        let mut sram = Sram::new(8 * MIB);
        let a = WorkingSet {
            queue: 0,
            private: MIB,
            shared: 5 * MIB,
            key: 7,
        };
        let b = WorkingSet { queue: 1, ..a };
        for _ in 0..30 {
            sram.touch(a, MIB);
            sram.touch(b, MIB);
        }
        // 5 + 1 + 1 MiB fit: both run from SRAM, the switch costs nothing implicit.
        assert_eq!(sram.touch(a, MIB).unwrap().missed, 0);
        assert_eq!(sram.touch(b, MIB).unwrap().missed, 0);
        assert_eq!(sram.resident(SHARED | 7), 5 * MIB);
    }

    #[test]
    fn nothing_declared_or_no_sram_is_left_alone() {
        let mut sram = Sram::new(8 * MIB);
        assert_eq!(sram.touch(ws(0, 0), MIB), None);
        let mut none = Sram::new(0);
        assert_eq!(none.touch(ws(0, MIB), MIB), None);
        sram.touch(ws(3, MIB), MIB);
        sram.clear();
        assert_eq!(sram.used(), 0);
    }
}
