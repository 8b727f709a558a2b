//! The ring's index arithmetic, as pure functions.
//!
//! Both sides count entries with free-running 32-bit counters that wrap at 2^32: the SQ tail
//! (entries the host wrote) and head (entries the device read), the CQ tail (entries the device
//! wrote) and head (entries the host read). Because the depth is a power of two no larger than
//! 2^15, 2^32 is a multiple of twice the depth, so every formula below stays right across the
//! counters' own wrap:
//!
//! - the slot of counter `c` is `c mod depth`;
//! - `tail - head` (wrapping) is the number of entries in the ring, `0..=depth`; full and empty
//!   are told apart without wasting a slot;
//! - the phase of counter `c` is `1` on even passes over the ring (`(c / depth)` even) and `0` on
//!   odd ones. The device writes each CQ entry with the phase of its counter; the memory starts
//!   zeroed (phase `0`), so the host knows the entry at its head is new when the entry's phase
//!   bit equals the phase of the head counter (the NVMe scheme: no device register is read).

/// The largest depth: command ids are 16-bit and `0xffff` is reserved for posted submissions.
pub const MAX_DEPTH: u32 = 1 << 15;

/// Whether `depth` is usable: a power of two from 2 to [`MAX_DEPTH`].
pub(crate) fn valid_depth(depth: u32) -> bool {
    depth.is_power_of_two() && (2..=MAX_DEPTH).contains(&depth)
}

/// The slot of counter `counter` in a ring of `depth` (a valid depth).
#[inline]
pub(crate) fn slot(counter: u32, depth: u32) -> u32 {
    counter & (depth - 1)
}

/// Entries between `head` and `tail`: `tail - head`, wrapping.
#[inline]
pub(crate) fn used(tail: u32, head: u32) -> u32 {
    tail.wrapping_sub(head)
}

/// Free slots in a ring of `depth` holding `tail - head` entries (0 if that is more than
/// `depth`, which only a misbehaving peer produces).
#[inline]
pub(crate) fn free(tail: u32, head: u32, depth: u32) -> u32 {
    depth.saturating_sub(used(tail, head))
}

/// The phase the entry written at `counter` carries: `true` (bit set) on even passes. The
/// pass's parity is bit `log2(depth)` of the counter (the depth is a power of two), tested
/// with a mask: a division here cost the device one `div` per completion.
#[inline]
pub(crate) fn phase(counter: u32, depth: u32) -> bool {
    debug_assert!(depth.is_power_of_two());
    counter & depth == 0
}

/// The SQ counter the host may write up to, given the device's written-back `head`, the host's
/// `tail`, `per_line` SQ entries per cache line (1: entries of 64 bytes or more, or a ring too
/// small to spare a line) and `reserve` slots always kept empty (1 when the device cannot tell
/// a full ring from an empty one: slot-valued doorbells, or an SQ head reported as a slot).
/// While the device still has entries to read (`tail != head`), the host leaves alone the slots
/// that share a cache line with the device's head: writing them would take the line away from
/// the device in the middle of its reads, and a full ring of small descriptors would then move
/// that line back and forth for every entry.
#[inline]
pub(crate) fn sq_limit(head: u32, tail: u32, depth: u32, per_line: u32, reserve: u32) -> u32 {
    let slack = if per_line > 1 && tail != head {
        head & (per_line - 1)
    } else {
        0
    };
    head.wrapping_add(depth).wrapping_sub(slack.max(reserve))
}

/// The counter a peer means by slot `slot` (`0..depth`), given the last counter `old` known for
/// that index: the first counter at or after `old` whose slot is `slot`. Exact as long as the
/// index moves less than `depth` between two reports, which the side that keeps one slot empty
/// (see `sq_limit`'s `reserve`) guarantees.
#[inline]
pub(crate) fn counter_of_slot(old: u32, slot: u32, depth: u32) -> u32 {
    old.wrapping_add(slot.wrapping_sub(old) & (depth - 1))
}

/// Slots the host may fill: from `tail` up to `limit`, or none if `limit` is behind `tail`
/// (it filled the device's line while the device was idle; a later limit counts from there).
/// The limit is at most `depth` ahead of the tail and less than `depth` behind it, and the
/// depth is at most [`MAX_DEPTH`], so the wrapping difference read as signed says which: the
/// test needs no `depth` (one load fewer on the submission path); it is checked in debug
/// builds.
#[inline]
pub(crate) fn room(tail: u32, limit: u32, depth: u32) -> u32 {
    let room = limit.wrapping_sub(tail) as i32;
    debug_assert!(room.unsigned_abs() <= depth, "limit {limit}, tail {tail}");
    room.max(0) as u32
}

/// Whether a peer's new index `new` is a legal move forward from `old` when it can be at most
/// `limit` (the other side's index, which it may not pass): `old <= new <= limit` along the
/// wrapping order.
#[inline]
pub(crate) fn advance_ok(old: u32, new: u32, limit: u32) -> bool {
    used(new, old) <= used(limit, old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths() {
        assert!(valid_depth(2));
        assert!(valid_depth(1024));
        assert!(valid_depth(MAX_DEPTH));
        for bad in [0, 1, 3, 6, 100, MAX_DEPTH * 2, u32::MAX] {
            assert!(!valid_depth(bad), "{bad}");
        }
    }

    #[test]
    fn slots_wrap_with_the_counter() {
        assert_eq!(slot(0, 8), 0);
        assert_eq!(slot(7, 8), 7);
        assert_eq!(slot(8, 8), 0);
        assert_eq!(slot(u32::MAX, 8), 7);
        assert_eq!(slot(u32::MAX.wrapping_add(1), 8), 0);
    }

    #[test]
    fn used_and_free_across_the_counter_wrap() {
        assert_eq!((used(0, 0), free(0, 0, 4)), (0, 4));
        assert_eq!((used(4, 0), free(4, 0, 4)), (4, 0), "full, no slot wasted");
        let head = u32::MAX - 1;
        let tail = head.wrapping_add(3);
        assert_eq!(tail, 1);
        assert_eq!((used(tail, head), free(tail, head, 4)), (3, 1));
        // A peer that claims more than the depth gets no free slots, not a huge count.
        assert_eq!(free(10, 0, 4), 0);
    }

    #[test]
    fn phase_flips_each_pass_and_survives_the_counter_wrap() {
        let depth = 4;
        let phases: Vec<bool> = (0..12).map(|c| phase(c, depth)).collect();
        let mut expect = Vec::new();
        for pass in 0..3 {
            expect.extend([pass % 2 == 0; 4]);
        }
        assert_eq!(phases, expect);
        // Across 2^32: the last pass before the wrap is odd (phase 0), the first after even.
        assert!(!phase(u32::MAX, depth));
        assert!(phase(u32::MAX.wrapping_add(1), depth));
        for depth in [2, 64, MAX_DEPTH] {
            assert_ne!(phase(u32::MAX, depth), phase(0, depth));
            assert_eq!(phase(u32::MAX - (depth - 1), depth), phase(u32::MAX, depth));
        }
        // First pass writes phase 1 over zeroed memory: a zeroed entry is never "new".
        assert!(phase(0, 8));
        // The mask is the pass's parity, for every depth, around 0 and around the wrap.
        // (Under Miri, scripts/miri.sh, depths up to 256: a million interpreted steps less.)
        let max_bits = if cfg!(miri) { 8 } else { 15 };
        for bits in 1..=max_bits {
            let depth = 1u32 << bits;
            for c in (0..3 * depth + 5).chain(u32::MAX - 3 * depth..=u32::MAX) {
                assert_eq!(
                    phase(c, depth),
                    (c / depth) % 2 == 0,
                    "counter {c}, depth {depth}"
                );
            }
        }
    }

    #[test]
    fn the_host_spares_the_line_the_device_reads() {
        // 8 entries per line, depth 32. The device has read up to 13 (line 1 holds 8..16) and
        // still has entries to read: the host stops at 32 + 8, not at 32 + 13.
        assert_eq!(sq_limit(13, 40, 32, 8, 0), 40);
        assert_eq!(room(40, sq_limit(13, 40, 32, 8, 0), 32), 0);
        assert_eq!(room(35, sq_limit(13, 35, 32, 8, 0), 32), 5);
        // At a line boundary, or with nothing left to read, the whole ring is usable.
        assert_eq!(sq_limit(16, 40, 32, 8, 0), 48);
        assert_eq!(sq_limit(13, 13, 32, 8, 0), 45);
        // Large entries (one per line) never hold anything back.
        assert_eq!(sq_limit(13, 40, 32, 1, 0), 45);
        // A limit behind the tail (filled while the device was idle) means no room, not 4 GiB.
        assert_eq!(room(45, 40, 32), 0);
        // Across the counter wrap.
        let head = u32::MAX - 2;
        assert_eq!(
            sq_limit(head, head.wrapping_add(1), 32, 8, 0),
            head.wrapping_add(32 - 5)
        );
        assert_eq!(room(head.wrapping_add(20), head.wrapping_add(27), 32), 7);
    }

    #[test]
    fn a_reserved_slot_keeps_the_ring_short_of_full() {
        // One slot kept empty: depth - 1 entries at most, whatever the line rule says.
        assert_eq!(sq_limit(16, 16, 32, 1, 1), 47);
        assert_eq!(sq_limit(16, 20, 32, 8, 1), 47);
        assert_eq!(room(16, sq_limit(16, 16, 32, 1, 1), 32), 31);
        // The line rule holds back more than the reserve: it wins.
        assert_eq!(sq_limit(13, 40, 32, 8, 1), 40);
        let head = u32::MAX;
        assert_eq!(sq_limit(head, head, 4, 1, 1), 2);
        assert_eq!(room(head, sq_limit(head, head, 4, 1, 1), 4), 3);
    }

    #[test]
    fn slots_convert_to_counters_across_both_wraps() {
        // Forward from the old counter, within one pass.
        assert_eq!(counter_of_slot(0, 0, 8), 0);
        assert_eq!(counter_of_slot(0, 7, 8), 7);
        assert_eq!(counter_of_slot(5, 2, 8), 10, "across the ring's wrap");
        assert_eq!(counter_of_slot(13, 5, 8), 13, "same slot: no move");
        assert_eq!(counter_of_slot(13, 4, 8), 20, "one short of a whole pass");
        // Across the counter's wrap at 2^32.
        let old = u32::MAX - 1; // slot 6 of 8
        assert_eq!(counter_of_slot(old, 7, 8), u32::MAX);
        assert_eq!(counter_of_slot(old, 0, 8), 0);
        assert_eq!(counter_of_slot(old, 3, 8), 3);
        for depth in [2, 64, MAX_DEPTH] {
            for old in [0, 1, depth - 1, u32::MAX - depth, u32::MAX] {
                for step in [0, 1, depth / 2, depth - 1] {
                    let new = old.wrapping_add(step);
                    assert_eq!(counter_of_slot(old, slot(new, depth), depth), new);
                }
            }
        }
    }

    #[test]
    fn advances_are_bounded_by_the_other_side() {
        assert!(advance_ok(0, 0, 0));
        assert!(advance_ok(0, 3, 3));
        assert!(!advance_ok(0, 4, 3), "past the limit");
        assert!(!advance_ok(5, 4, 8), "backwards");
        let old = u32::MAX - 1;
        assert!(advance_ok(old, 1, 2), "across the counter wrap");
        assert!(!advance_ok(old, 3, 2));
    }
}
