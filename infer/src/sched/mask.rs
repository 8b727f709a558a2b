//! Sets of a scheduler's streams as 64-bit masks (a scheduler takes at most
//! [`MAX_STREAMS`](super::MAX_STREAMS) streams): one stream's bit, the streams for which a
//! condition holds, and the streams of a set in order ([`Bits`]).

use super::StreamSpec;

/// The single bit of stream `i`.
#[inline]
pub(super) fn bit(i: usize) -> u64 {
    1u64 << i
}

/// The streams (at most 64) for which `f` holds, as a mask.
pub(super) fn mask_of(streams: &[StreamSpec], f: impl Fn(&StreamSpec) -> bool) -> u64 {
    streams
        .iter()
        .enumerate()
        .filter(|(_, s)| f(s))
        .fold(0, |m, (i, _)| m | bit(i))
}

/// The set bits of a mask, lowest first.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bits(pub(super) u64);

impl Iterator for Bits {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(i)
    }
}
