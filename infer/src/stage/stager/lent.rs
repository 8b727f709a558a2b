//! Requests on lent buffers ([`Stager::read_lent`], [`Stager::write_lent`]): the buffer stays
//! the caller's, and the call returns only once the kernel is done with it (other requests
//! in flight go on meanwhile).

use super::{InFlight, Op, Stager, Transfer};
use crate::stage::{Error, File};
use userdma::pool::OwnedBuffer;

impl Stager {
    /// Reads `len` bytes at `offset` of `file` into the first `len` bytes of `buffer`, which
    /// stays the caller's, and waits for the read (other requests in flight go on; their
    /// completions wait in [`Stager::wait`]'s queue). Short reads of a regular file are
    /// resumed as for [`Stager::read`]; the buffer's length is left as it is.
    ///
    /// The kernel writes the buffer only while this call runs: it returns once the read's
    /// completion is in. If the ring cannot be waited on any more (`io_uring_enter` failing
    /// with something other than `EINTR`/`EBUSY`, which a valid ring does not do) the process
    /// aborts, since returning would hand back a buffer the kernel may still write.
    ///
    /// # Errors
    /// As [`Stager::read`], and [`Error::Length`] if `len` exceeds the buffer's length.
    pub(crate) fn read_lent(
        &mut self,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Transfer, Error> {
        self.lent(Op::Read, file, offset, buffer, len)
    }

    /// Writes the first `len` bytes of `buffer` to `offset` of `file` and waits for the write,
    /// as [`Stager::read_lent`] (the kernel only reads the buffer).
    ///
    /// # Errors
    /// As [`Stager::write`], and [`Error::Length`].
    pub(crate) fn write_lent(
        &mut self,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Transfer, Error> {
        if !file.is_writable() {
            return Err(Error::ReadOnly {
                path: file.path().to_owned(),
            });
        }
        self.lent(Op::Write, file, offset, buffer, len)
    }

    fn lent(
        &mut self,
        op: Op,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Transfer, Error> {
        if len > buffer.len() {
            return Err(Error::Length {
                len,
                buffer: buffer.len(),
            });
        }
        let fixed = self.check(file, offset, buffer, len)?;
        let request = InFlight {
            op,
            file: file.clone(),
            offset,
            wanted: len,
            done: 0,
            fixed,
            cancelled: false,
            exact: false,
            addr: buffer.as_ptr().as_ptr() as usize,
            buffer: None,
        };
        let key = self.enqueue(request).map_err(|(error, _)| error)?;
        loop {
            if let Some(i) = self.lent.iter().position(|&(k, _)| k == key) {
                return self.lent.swap_remove(i).1;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    eprintln!(
                        "userdma: io_uring_enter failed ({e}) while a {op} into a lent pool \
                         buffer was in flight; aborting rather than handing back a buffer the \
                         kernel may still write"
                    );
                    std::process::abort();
                }
            }
            self.reap();
        }
    }
}
