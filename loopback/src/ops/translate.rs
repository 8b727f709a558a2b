//! Host memory as the device reaches it: a [`Span`] of a mapping kept alive while it is used,
//! the device's translation table ([`Translate`]), and [`Host`], the engine's lookups through
//! it with the last piece resolved cached while the table does not change.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::u64_of;
use crate::StatusCode;
use userdma::dma::{self, Access};
use userdma::memory::Region;

/// Host memory the device resolved: `len` bytes at `ptr`, kept mapped while the span lives.
#[derive(Debug)]
pub(crate) struct Span {
    ptr: NonNull<u8>,
    len: usize,
    /// What the mapping lets the device do.
    access: Access,
    _keep: Keep,
}

/// What keeps a span's memory mapped.
#[derive(Debug)]
#[allow(dead_code)] // Held for its Drop only.
enum Keep {
    /// A translation of the in-process table (holds the region).
    Window(dma::Window),
    /// A region the device process mapped from a memfd.
    Region(Arc<Region>),
}

// SAFETY: a Span is a pointer into a mapping that its owner keeps alive, accessed only through
// raw pointers (never references); the owners are Send and Sync.
unsafe impl Send for Span {}
// SAFETY: as for Send.
unsafe impl Sync for Span {}

impl Span {
    /// `len` bytes at `offset` of `region` (the caller checked `offset + len <= region.len()`),
    /// which the device may reach as `access` says.
    pub(crate) fn in_region(
        region: Arc<Region>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Option<Span> {
        if offset.checked_add(len)? > region.len() || len == 0 {
            return None;
        }
        // SAFETY: `offset + len <= region.len()`: inside the mapping.
        let ptr = unsafe { region.as_ptr().add(offset) };
        Some(Span {
            ptr,
            len,
            access,
            _keep: Keep::Region(region),
        })
    }

    /// `len` bytes at `offset` of the span, holding the same memory; `None` unless inside it
    /// (and `len > 0`).
    pub(crate) fn sub(self, offset: usize, len: usize) -> Option<Span> {
        if len == 0 || offset.checked_add(len)? > self.len {
            return None;
        }
        Some(Span {
            // SAFETY: `offset + len <= self.len`: inside the mapping.
            ptr: unsafe { self.ptr.add(offset) },
            len,
            access: self.access,
            _keep: self._keep,
        })
    }

    /// The first byte (raw).
    pub(crate) fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether its mapping lets the device write it.
    pub(crate) fn device_writes(&self) -> bool {
        self.access.device_writes()
    }
}

/// The device's translation table: the mapped piece that holds an IOVA, and a generation
/// number that moves on every change of the table.
pub(crate) trait Translate: Send + Sync + std::fmt::Debug {
    /// The whole mapped piece holding `iova`: its first and last IOVA and its memory.
    fn piece(&self, iova: u64) -> Option<(u64, u64, Span)>;

    /// Moves on every map and unmap (a piece resolved while it had one value is still mapped
    /// while it has it).
    fn generation(&self) -> u64;

    /// Resolves `len` bytes at `iova` to host memory, or `None` unless they all lie in one
    /// mapped piece (and `len > 0`).
    fn translate(&self, iova: u64, len: usize) -> Option<Span> {
        let (start, _, span) = self.piece(iova)?;
        let at = usize::try_from(iova - start).ok()?;
        span.sub(at, len)
    }
}

impl Translate for dma::SoftIommu {
    fn piece(&self, iova: u64) -> Option<(u64, u64, Span)> {
        let (range, window) = self.piece_at(iova)?;
        Some((
            range.start,
            range.last,
            Span {
                ptr: window.as_ptr(),
                len: window.len(),
                access: window.access(),
                _keep: Keep::Window(window),
            },
        ))
    }

    fn generation(&self) -> u64 {
        dma::SoftIommu::generation(self)
    }
}

/// The piece the engine resolved last, and the table generation it was resolved in.
#[derive(Debug)]
struct Cached {
    generation: u64,
    start: u64,
    last: u64,
    span: Span,
}

/// Host memory as the engine reaches it: through the translation table, with the last piece
/// resolved kept while the table does not change, so a run of descriptors into one mapping
/// costs one lookup (and no lock) instead of one per descriptor.
#[derive(Debug)]
pub(crate) struct Host {
    table: Arc<dyn Translate>,
    cached: Option<Cached>,
}

impl Host {
    pub(crate) fn new(table: Arc<dyn Translate>) -> Host {
        Host {
            table,
            cached: None,
        }
    }

    /// The table.
    pub(crate) fn table(&self) -> &dyn Translate {
        &*self.table
    }

    /// The host address of `len` bytes at `iova` for the device to read (`write` false) or
    /// write: [`StatusCode::HostUnmapped`] unless they all lie in one mapped piece (and
    /// `len > 0`), [`StatusCode::HostAccess`] where the mapping does not let the device do
    /// it. The address stays valid until the next call (the cache keeps its piece mapped).
    #[inline]
    pub(super) fn resolve_for(
        &mut self,
        iova: u64,
        len: usize,
        write: bool,
    ) -> Result<NonNull<u8>, StatusCode> {
        let Some(at) = self.resolve(iova, len) else {
            #[cfg(feature = "tracing")]
            translation_fault(iova, len, write, StatusCode::HostUnmapped);
            return Err(StatusCode::HostUnmapped);
        };
        let access = self
            .cached
            .as_ref()
            .map_or(Access::ReadWrite, |c| c.span.access);
        let allowed = if write {
            access.device_writes()
        } else {
            access.device_reads()
        };
        if allowed {
            Ok(at)
        } else {
            #[cfg(feature = "tracing")]
            translation_fault(iova, len, write, StatusCode::HostAccess);
            Err(StatusCode::HostAccess)
        }
    }

    /// The host address of `len` bytes at `iova`, or `None` unless they all lie in one mapped
    /// piece (and `len > 0`). The address stays valid until the next call (the cache keeps
    /// its piece mapped).
    #[inline]
    pub(super) fn resolve(&mut self, iova: u64, len: usize) -> Option<NonNull<u8>> {
        let last = iova.checked_add(u64_of(len).checked_sub(1)?)?;
        let generation = self.table.generation();
        let hit = self
            .cached
            .as_ref()
            .is_some_and(|c| c.generation == generation && c.start <= iova && iova <= c.last);
        if !hit {
            // Drop the old piece first: it may be the last hold on an unmapped region.
            self.cached = None;
            let (start, end, span) = self.table.piece(iova)?;
            self.cached = Some(Cached {
                generation,
                start,
                last: end,
                span,
            });
        }
        let cached = self.cached.as_ref()?;
        if last > cached.last {
            return None;
        }
        let at = usize::try_from(iova - cached.start).ok()?;
        // `iova..=last` lies in the piece, so `at + len <= span.len()`.
        debug_assert!(at + len <= cached.span.len());
        // SAFETY: `at + len <= span.len()` (the range lies in the piece): inside the mapping.
        Some(unsafe { cached.span.as_ptr().add(at) })
    }
}

/// Reports a host access the device's translation refused, as an IOMMU reports a DMA fault
/// (the `tracing` feature): out of line, so the descriptor path that calls it stays as it is.
#[cfg(feature = "tracing")]
#[cold]
#[inline(never)]
fn translation_fault(iova: u64, len: usize, write: bool, status: StatusCode) {
    tracing::warn!(
        iova = %dma::Iova(iova),
        len,
        access = if write { "write" } else { "read" },
        status = status.name(),
        "DMA translation fault"
    );
}
