//! Device memory as a resource: [`DeviceMemory`], a range allocator over a device's memory
//! (the loopback device's BAR 2, an NPU's DRAM window), handing out [`Range`]s that free
//! themselves on drop. Callers stop computing `window + i * size` by hand; a planned model's
//! arena is one range.
//!
//! Not on a per-descriptor path: ranges are taken when a pipeline or model is set up, so the
//! free list is a `BTreeMap` behind a mutex (first fit by address, neighbours merged on free).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use super::{Device, Error};
use crate::dma::DeviceOffset;

/// A range allocator over `size` bytes of device memory. Cheap to clone (clones share it).
#[derive(Clone)]
pub struct DeviceMemory {
    inner: Arc<Inner>,
}

struct Inner {
    bar: usize,
    size: u64,
    /// Free ranges, start -> length; never adjacent (merged on free), never empty.
    free: Mutex<BTreeMap<u64, u64>>,
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("bar", &self.inner.bar)
            .field("size", &self.inner.size)
            .field("free", &self.free_bytes())
            .finish()
    }
}

impl DeviceMemory {
    /// An allocator over `size` bytes of BAR `bar`, all free.
    pub fn new(bar: usize, size: u64) -> DeviceMemory {
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        DeviceMemory {
            inner: Arc::new(Inner {
                bar,
                size,
                free: Mutex::new(free),
            }),
        }
    }

    /// An allocator over all of `device`'s BAR `bar`.
    ///
    /// # Errors
    /// As [`Device::bar`] for a BAR the device does not have.
    pub fn of_bar(device: &dyn Device, bar: usize) -> Result<DeviceMemory, Error> {
        let len = device.bar(bar)?.len();
        Ok(DeviceMemory::new(bar, len as u64))
    }

    /// The BAR the memory is in.
    pub fn bar(&self) -> usize {
        self.inner.bar
    }

    /// Bytes of device memory in all.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// Bytes free now.
    pub fn free_bytes(&self) -> u64 {
        self.inner.lock().values().sum()
    }

    /// The largest free range now.
    pub fn largest_free(&self) -> u64 {
        self.inner.lock().values().copied().max().unwrap_or(0)
    }

    /// `len` bytes at the lowest offset that is a multiple of `align` (a power of two) and
    /// free.
    ///
    /// # Errors
    /// [`Error::DeviceMemoryRange`] for `len == 0` or a bad alignment,
    /// [`Error::DeviceMemoryExhausted`] if no free range holds it.
    pub fn alloc(&self, len: u64, align: u64) -> Result<Range, Error> {
        let bad = |why| Error::DeviceMemoryRange {
            offset: 0,
            len,
            align,
            why,
        };
        if len == 0 {
            return Err(bad("the length is zero"));
        }
        if !align.is_power_of_two() {
            return Err(bad("the alignment is not a power of two"));
        }
        let mut free = self.inner.lock();
        let found = free.iter().find_map(|(&start, &flen)| {
            let at = start.checked_next_multiple_of(align)?;
            let end = at.checked_add(len)?;
            (end <= start + flen).then_some(at)
        });
        match found {
            Some(at) => {
                take(&mut free, at, len);
                Ok(self.range(at, len))
            }
            None => Err(Error::DeviceMemoryExhausted {
                len,
                align,
                free: free.values().sum(),
                largest: free.values().copied().max().unwrap_or(0),
                size: self.inner.size,
            }),
        }
    }

    /// The `len` bytes at `offset` exactly (a pre-placed buffer).
    ///
    /// # Errors
    /// [`Error::DeviceMemoryRange`] if they are empty, outside the memory, or not all free.
    pub fn alloc_at(&self, offset: DeviceOffset, len: u64) -> Result<Range, Error> {
        let bad = |why| Error::DeviceMemoryRange {
            offset: offset.raw(),
            len,
            align: 1,
            why,
        };
        if len == 0 {
            return Err(bad("the length is zero"));
        }
        let at = offset.raw();
        let end = at
            .checked_add(len)
            .filter(|&end| end <= self.inner.size)
            .ok_or_else(|| bad("it ends past the device memory"))?;
        let mut free = self.inner.lock();
        let holds = free
            .range(..=at)
            .next_back()
            .is_some_and(|(&start, &flen)| end <= start + flen);
        if !holds {
            return Err(bad("part of it is in use"));
        }
        take(&mut free, at, len);
        Ok(self.range(at, len))
    }

    fn range(&self, at: u64, len: u64) -> Range {
        Range {
            offset: DeviceOffset(at),
            len,
            owner: Arc::clone(&self.inner),
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u64>> {
        // The map is consistent after every statement that changes it: a panic elsewhere while
        // holding the lock leaves nothing half-done.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Removes `[at, at + len)`, which lies inside one free range, from `free`.
fn take(free: &mut BTreeMap<u64, u64>, at: u64, len: u64) {
    let Some((&start, &flen)) = free.range(..=at).next_back() else {
        return;
    };
    free.remove(&start);
    if at > start {
        free.insert(start, at - start);
    }
    let end = at + len;
    if end < start + flen {
        free.insert(end, start + flen - end);
    }
}

/// A range of device memory, returned to its [`DeviceMemory`] when dropped.
pub struct Range {
    offset: DeviceOffset,
    len: u64,
    owner: Arc<Inner>,
}

impl fmt::Debug for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Range({}+{:#x})", self.offset, self.len)
    }
}

impl Range {
    /// The first byte's offset in device memory.
    pub fn offset(&self) -> DeviceOffset {
        self.offset
    }

    /// Bytes in the range.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the range is empty (never, for a range from [`DeviceMemory`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device offset of byte `at` of the range, or `None` past its end.
    pub fn at(&self, at: u64) -> Option<DeviceOffset> {
        (at < self.len).then(|| DeviceOffset(self.offset.raw() + at))
    }

    /// The BAR the range is in.
    pub fn bar(&self) -> usize {
        self.owner.bar
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        let mut free = self.owner.lock();
        let mut start = self.offset.raw();
        let mut len = self.len;
        if let Some((&prev, &plen)) = free.range(..start).next_back() {
            if prev + plen == start {
                free.remove(&prev);
                start = prev;
                len += plen;
            }
        }
        if let Some(next_len) = free.remove(&(start + len)) {
            len += next_len;
        }
        free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_first_fit_aligned_and_merge_back() {
        let memory = DeviceMemory::new(2, 4096);
        let a = memory.alloc(100, 64).expect("a");
        let b = memory.alloc(100, 256).expect("b");
        assert_eq!(
            (a.offset(), b.offset()),
            (DeviceOffset(0), DeviceOffset(256))
        );
        assert_eq!(memory.free_bytes(), 4096 - 200);
        assert_eq!(a.at(99), Some(DeviceOffset(99)));
        assert_eq!(a.at(100), None);
        drop(a);
        let c = memory.alloc(64, 1).expect("c");
        assert_eq!(c.offset(), DeviceOffset(0), "the freed hole is reused");
        drop((b, c));
        assert_eq!(memory.free_bytes(), 4096);
        assert_eq!(
            memory.largest_free(),
            4096,
            "neighbours merged into one range"
        );
    }

    #[test]
    fn bad_and_impossible_requests_are_errors_that_say_why() {
        let memory = DeviceMemory::new(2, 1024);
        assert!(matches!(
            memory.alloc(0, 1),
            Err(Error::DeviceMemoryRange { .. })
        ));
        assert!(matches!(
            memory.alloc(8, 3),
            Err(Error::DeviceMemoryRange { .. })
        ));
        let _all = memory.alloc(1024, 1).expect("all of it");
        let err = memory.alloc(1, 1).unwrap_err();
        assert!(err.to_string().contains("0 of 1024 bytes free"), "{err}");
        assert!(memory.alloc(u64::MAX, 1).is_err());
    }

    #[test]
    fn fixed_ranges_must_be_inside_and_free() {
        let memory = DeviceMemory::new(2, 1024);
        let fixed = memory.alloc_at(DeviceOffset(512), 256).expect("fixed");
        assert!(memory.alloc_at(DeviceOffset(600), 8).is_err(), "overlaps");
        assert!(
            memory.alloc_at(DeviceOffset(1000), 100).is_err(),
            "past the end"
        );
        assert!(
            memory.alloc_at(DeviceOffset(u64::MAX), 2).is_err(),
            "overflows"
        );
        let low = memory.alloc(512, 1).expect("below it");
        assert_eq!(low.offset(), DeviceOffset(0));
        let high = memory.alloc(256, 1).expect("above it");
        assert_eq!(high.offset(), DeviceOffset(768));
        drop((fixed, low, high));
        assert_eq!(memory.largest_free(), 1024);
    }
}
