//! [`Layout`]: how a pool's arena is cut into io_uring fixed buffers, and where a pool buffer
//! lies in them. Pure arithmetic over offsets, unit-tested here.

use super::Error;

/// The kernel's limit on fixed buffers per ring (`IORING_MAX_REG_BUFFERS`).
pub const MAX_FIXED_BUFFERS: u32 = 1 << 14;
/// The kernel's limit on one fixed buffer's size (1 GiB).
pub const MAX_FIXED_BUFFER_BYTES: usize = 1 << 30;

/// Where a byte range lies in the registered memory: fixed buffer `index`, `offset` bytes
/// into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    /// The fixed-buffer index (`buf_index` of `READ_FIXED` / `WRITE_FIXED`).
    pub index: u16,
    /// Bytes from the start of that fixed buffer.
    pub offset: usize,
}

/// An arena of `len` bytes (at mapping offset `start`) cut into pieces of `piece` bytes, each
/// aligned in the arena to its size; the last one may be shorter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    start: usize,
    len: usize,
    piece: usize,
    count: u32,
}

impl Layout {
    /// The layout of an arena of `len` bytes at mapping offset `start`: one piece if it is at
    /// most 1 GiB, else 1 GiB pieces.
    ///
    /// # Errors
    /// [`Error::TooManyFixedBuffers`] past 16,384 pieces (an arena of more than 16 TiB).
    pub fn new(start: usize, len: usize) -> Result<Layout, Error> {
        let piece = len.clamp(1, MAX_FIXED_BUFFER_BYTES);
        let count = len.div_ceil(piece);
        if count > MAX_FIXED_BUFFERS as usize {
            return Err(Error::TooManyFixedBuffers {
                bytes: len as u64,
                piece: piece as u64,
                needed: count as u64,
                max: u64::from(MAX_FIXED_BUFFERS),
            });
        }
        Ok(Layout {
            start,
            len,
            piece,
            // At most MAX_FIXED_BUFFERS: fits.
            count: count as u32,
        })
    }

    /// Number of fixed buffers.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes registered (the arena).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of fixed buffer `index` (mapping offset, length).
    pub fn piece(&self, index: u32) -> Option<(usize, usize)> {
        if index >= self.count {
            return None;
        }
        let from = index as usize * self.piece;
        Some((self.start + from, self.piece.min(self.len - from)))
    }

    /// Where `len` bytes at mapping offset `offset` lie, if inside one fixed buffer.
    pub fn locate(&self, offset: usize, len: usize) -> Option<Fixed> {
        let rel = offset.checked_sub(self.start)?;
        let end = rel.checked_add(len)?;
        if end > self.len {
            return None;
        }
        let index = rel / self.piece;
        let inner = rel % self.piece;
        if inner + len > self.piece {
            return None;
        }
        Some(Fixed {
            index: u16::try_from(index).ok()?,
            offset: inner,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_arena_is_one_fixed_buffer() {
        let layout = Layout::new(4096, 64 << 20).expect("layout");
        assert_eq!(layout.count(), 1);
        assert_eq!(layout.piece(0), Some((4096, 64 << 20)));
        assert_eq!(layout.piece(1), None);
        assert_eq!(
            layout.locate(4096 + 8192, 4096),
            Some(Fixed {
                index: 0,
                offset: 8192
            })
        );
        assert_eq!(layout.locate(0, 16), None, "before the arena");
        assert_eq!(
            layout.locate(4096 + (64 << 20) - 8, 16),
            None,
            "past its end"
        );
    }

    #[test]
    fn a_large_arena_is_cut_at_gib_boundaries() {
        let len = (5 << 30) + (2 << 20);
        let layout = Layout::new(0, len).expect("layout");
        assert_eq!(layout.count(), 6);
        assert_eq!(layout.piece(5), Some((5 << 30, 2 << 20)));
        assert_eq!(
            layout.locate((3 << 30) + 256, 1 << 20),
            Some(Fixed {
                index: 3,
                offset: 256
            })
        );
        assert_eq!(layout.locate((1 << 30) - 256, 512), None, "straddles two");
        assert_eq!(layout.locate(usize::MAX, 2), None, "overflow");
    }

    #[test]
    fn more_than_16384_fixed_buffers_are_refused() {
        assert!(Layout::new(0, 16384 << 30).is_ok());
        let err = Layout::new(0, (16384 << 30) + 1).expect_err("too many");
        assert!(err.to_string().contains("16384"), "{err}");
    }
}
