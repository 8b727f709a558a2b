//! Interval sweeps: the overlap of two sets of intervals, and how many intervals are open at
//! once. Intervals are half-open `[start, end)`; empty ones count for nothing.

use super::Span;

/// Time during which some `a` and some `b` interval are both open, and time during which
/// either is open: `(both_ns, either_ns)`.
///
/// Sort the starts and ends of all intervals, walk them in time order keeping how many of
/// each kind are open, and add each gap between two event times to `both` or `either` by the
/// counts that held during it. Exact, `O(n log n)`.
pub(crate) fn overlap(a: &[Span], b: &[Span]) -> (u64, u64) {
    // (time, change in open `a` intervals, change in open `b` intervals)
    let mut events: Vec<(u64, i64, i64)> = Vec::with_capacity(2 * (a.len() + b.len()));
    for s in a.iter().filter(|s| s.duration_ns() > 0) {
        events.push((s.start_ns, 1, 0));
        events.push((s.end_ns, -1, 0));
    }
    for s in b.iter().filter(|s| s.duration_ns() > 0) {
        events.push((s.start_ns, 0, 1));
        events.push((s.end_ns, 0, -1));
    }
    events.sort_unstable_by_key(|e| e.0);
    let (mut open_a, mut open_b) = (0i64, 0i64);
    let (mut both, mut either) = (0u64, 0u64);
    let mut at = events.first().map_or(0, |e| e.0);
    for (t, da, db) in events {
        let gap = t - at;
        if open_a > 0 && open_b > 0 {
            both += gap;
        }
        if open_a > 0 || open_b > 0 {
            either += gap;
        }
        open_a += da;
        open_b += db;
        at = t;
    }
    (both, either)
}

/// How many intervals are open over time: `(integral_ns, window_ns, max_open)`, where the
/// integral is the sum over time of the number open (equal to the sum of the lengths), the
/// window runs from the first start to the last end, and the maximum is taken after all
/// changes at one instant (an interval ending where another starts is not an overlap).
pub(crate) fn occupancy(spans: &[Span]) -> (u128, u64, u64) {
    let mut events: Vec<(u64, i64)> = Vec::with_capacity(2 * spans.len());
    for s in spans.iter().filter(|s| s.duration_ns() > 0) {
        events.push((s.start_ns, 1));
        events.push((s.end_ns, -1));
    }
    events.sort_unstable_by_key(|e| e.0);
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return (0, 0, 0);
    };
    let window = last.0 - first.0;
    let (mut open, mut max, mut integral) = (0i64, 0i64, 0u128);
    let mut at = first.0;
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        integral += u128::from(t - at) * u128::from(open.unsigned_abs());
        while i < events.len() && events[i].0 == t {
            open += events[i].1;
            i += 1;
        }
        max = max.max(open);
        at = t;
    }
    (integral, window, max.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start_ns: u64, end_ns: u64) -> Span {
        Span::new(start_ns, end_ns)
    }

    #[test]
    fn overlap_of_hand_made_spans() {
        assert_eq!(overlap(&[s(0, 10)], &[s(5, 15)]), (5, 15));
        assert_eq!(overlap(&[], &[]), (0, 0));
        assert_eq!(overlap(&[s(0, 10)], &[]), (0, 10));
        // Disjoint, with a gap that counts for neither.
        assert_eq!(overlap(&[s(0, 10)], &[s(20, 30)]), (0, 20));
        // Touching end to start is not overlap.
        assert_eq!(overlap(&[s(0, 10)], &[s(10, 20)]), (0, 20));
        // Overlapping DMA spans are one busy stretch; compute inside it twice.
        assert_eq!(
            overlap(&[s(0, 10), s(5, 20)], &[s(2, 4), s(18, 25)]),
            (4, 25)
        );
        // Empty spans count for nothing.
        assert_eq!(overlap(&[s(5, 5)], &[s(0, 10)]), (0, 10));
    }

    #[test]
    fn occupancy_of_hand_made_spans() {
        assert_eq!(occupancy(&[]), (0, 0, 0));
        assert_eq!(occupancy(&[s(0, 10), s(5, 15)]), (20, 15, 2));
        // Back to back: never two at once.
        assert_eq!(occupancy(&[s(0, 10), s(10, 20)]), (20, 20, 1));
        // Three nested, one after a gap.
        assert_eq!(
            occupancy(&[s(0, 100), s(10, 20), s(15, 30), s(200, 250)]),
            (175, 250, 3)
        );
    }
}
