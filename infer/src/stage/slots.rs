//! [`Slots`]: the table of requests in flight, keyed by what goes into an SQE's `user_data`:
//! a slot index in the low 32 bits and the slot's generation above it, so a stale or forged
//! key (a completion of a request already retired) never matches a newer request in the same
//! slot. Bit 63 is left clear for the stager's own cancel requests.

/// `user_data` bit the stager sets on its `ASYNC_CANCEL` entries: never a slot key.
pub(super) const CANCEL_BIT: u64 = 1 << 63;
/// Generations wrap within 31 bits so a key never has [`CANCEL_BIT`] set.
const GEN_MASK: u32 = (1 << 31) - 1;

#[derive(Debug)]
struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

/// A fixed-capacity table of values with generation-checked keys.
#[derive(Debug)]
pub(super) struct Slots<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Slots<T> {
    /// A table of `capacity` slots (at most `u32::MAX`).
    pub(super) fn new(capacity: u32) -> Slots<T> {
        Slots {
            entries: (0..capacity)
                .map(|_| Entry {
                    generation: 0,
                    value: None,
                })
                .collect(),
            free: (0..capacity).rev().collect(),
            live: 0,
        }
    }

    /// Values held.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// Stores `value`, returning its key, or gives it back if the table is full.
    pub(super) fn insert(&mut self, value: T) -> Result<u64, T> {
        let Some(index) = self.free.pop() else {
            return Err(value);
        };
        let entry = &mut self.entries[index as usize];
        entry.value = Some(value);
        self.live += 1;
        Ok(key(index, entry.generation))
    }

    fn entry(&self, key: u64) -> Option<&Entry<T>> {
        let (index, generation) = split(key)?;
        self.entries
            .get(index as usize)
            .filter(|e| e.generation == generation && e.value.is_some())
    }

    /// The value under `key`, if it is still there.
    pub(super) fn get(&self, key: u64) -> Option<&T> {
        self.entry(key).and_then(|e| e.value.as_ref())
    }

    /// The value under `key`, mutably.
    pub(super) fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        self.entry(key)?;
        let (index, _) = split(key)?;
        self.entries[index as usize].value.as_mut()
    }

    /// Takes the value under `key` out; the slot's next key differs from every earlier one
    /// (until the generation wraps after 2^31 uses of the slot).
    pub(super) fn remove(&mut self, key: u64) -> Option<T> {
        self.entry(key)?;
        let (index, _) = split(key)?;
        let entry = &mut self.entries[index as usize];
        let value = entry.value.take();
        entry.generation = entry.generation.wrapping_add(1) & GEN_MASK;
        self.free.push(index);
        self.live -= 1;
        value
    }

    /// Keys of every value held.
    pub(super) fn keys(&self) -> Vec<u64> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.value.is_some())
            // Indices come from a `u32` capacity.
            .map(|(i, e)| key(i as u32, e.generation))
            .collect()
    }

    /// Takes every value out.
    pub(super) fn drain(&mut self) -> Vec<T> {
        self.keys()
            .into_iter()
            .filter_map(|k| self.remove(k))
            .collect()
    }
}

fn key(index: u32, generation: u32) -> u64 {
    u64::from(generation) << 32 | u64::from(index)
}

/// Index and generation of a key; `None` for a cancel entry's `user_data`.
fn split(key: u64) -> Option<(u32, u32)> {
    if key & CANCEL_BIT != 0 {
        return None;
    }
    // Low and high halves.
    Some((key as u32, (key >> 32) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_against_the_generation() {
        let mut slots = Slots::new(2);
        let a = slots.insert("a").expect("room");
        let b = slots.insert("b").expect("room");
        assert_eq!(slots.insert("c"), Err("c"));
        assert_eq!(slots.remove(a), Some("a"));
        assert_eq!(slots.remove(a), None, "twice");
        let c = slots.insert("c").expect("room again");
        assert_ne!(a, c, "same slot, new generation");
        assert_eq!(slots.get(a), None, "a stale key misses");
        assert_eq!(slots.get(c), Some(&"c"));
        assert_eq!(slots.get(c | CANCEL_BIT), None);
        *slots.get_mut(b).expect("b") = "B";
        assert_eq!(slots.len(), 2);
        let mut all = slots.drain();
        all.sort_unstable();
        assert_eq!(all, ["B", "c"]);
        assert_eq!(slots.len(), 0);
    }

    #[test]
    fn generations_never_reach_the_cancel_bit() {
        let mut slots = Slots::new(1);
        slots.entries[0].generation = GEN_MASK;
        let k = slots.insert(1).expect("room");
        assert_eq!(k & CANCEL_BIT, 0);
        slots.remove(k);
        assert_eq!(slots.entries[0].generation, 0, "wrapped");
    }
}
