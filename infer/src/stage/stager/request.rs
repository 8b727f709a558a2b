//! A request and what comes back: read or write ([`Op`]), the [`Ticket`] that names it from
//! submission to completion, the bytes it moved ([`Transfer`]), and the [`Completion`] that
//! hands its buffer back.

use std::fmt;

use crate::stage::{Error, File};
use userdma::pool::OwnedBuffer;

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// File to buffer.
    Read,
    /// Buffer to file.
    Write,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
        })
    }
}

/// Names one request from submission to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(pub(super) u64);

impl Ticket {
    /// The number (unique among the requests in flight).
    pub fn raw(self) -> u64 {
        self.0
    }
}

/// Bytes a completed request moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes moved.
    pub bytes: usize,
    /// Bytes asked for.
    pub requested: usize,
}

impl Transfer {
    /// Whether fewer bytes moved than asked: for a read, the file ends at `offset + bytes`.
    pub fn is_short(&self) -> bool {
        self.bytes < self.requested
    }
}

/// A finished request: its ticket, the buffer back, and what happened.
#[derive(Debug)]
pub struct Completion {
    /// The request's ticket.
    pub ticket: Ticket,
    /// Read or write.
    pub op: Op,
    /// File offset of the request.
    pub offset: u64,
    /// The buffer; after a read its length is the bytes read.
    pub buffer: OwnedBuffer,
    /// Bytes moved, or why not.
    pub result: Result<Transfer, Error>,
    pub(super) file: File,
}

impl Completion {
    /// The buffer, if the request moved every byte asked for.
    ///
    /// # Errors
    /// The request's error; [`Error::Eof`] for a read that found no data, [`Error::ShortRead`]
    /// for one that found fewer bytes than asked.
    pub fn into_full(self) -> Result<OwnedBuffer, Error> {
        let transfer = self.result?;
        if !transfer.is_short() {
            return Ok(self.buffer);
        }
        let path = self.file.path().to_owned();
        Err(if transfer.bytes == 0 {
            Error::Eof {
                path,
                offset: self.offset,
            }
        } else {
            Error::ShortRead {
                path,
                offset: self.offset,
                wanted: transfer.requested,
                got: transfer.bytes,
                end: self.offset + transfer.bytes as u64,
            }
        })
    }

    /// The file of the request.
    pub fn file(&self) -> &File {
        &self.file
    }
}
