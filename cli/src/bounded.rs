//! Reading a file the user names, up to a stated size. `/dev/zero`, a pipe that never ends or a
//! file far larger than any real input is refused once the limit is passed, instead of being
//! read until the machine runs out of memory.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Why a bounded read failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Opening or reading the file failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The file holds more than the limit (a regular file's size says so before any of it is
    /// read; anything else is read up to one byte past the limit).
    #[error("larger than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

/// The bytes of the file at `path`, at most `limit` of them: [`Error::TooLarge`] when it has
/// more. Reads through `take(limit + 1)`, so a device or a pipe that never ends stops there.
pub(crate) fn read(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    let file = File::open(path)?;
    let too_large = Error::TooLarge { limit };
    let mut bytes = Vec::new();
    match file.metadata() {
        // A regular file says its size: a large one is refused before any of it is read, and
        // the buffer is the right size from the start.
        Ok(meta) if meta.is_file() => {
            if meta.len() > limit {
                return Err(too_large);
            }
            bytes.reserve(usize::try_from(meta.len()).unwrap_or(0));
        }
        _ => {}
    }
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > limit) {
        return Err(too_large);
    }
    Ok(bytes)
}

/// As [`read`], the bytes as UTF-8 text; text that is not UTF-8 is an
/// [`io::ErrorKind::InvalidData`] error, as from `std::fs::read_to_string`.
pub(crate) fn read_to_string(path: &Path, limit: u64) -> Result<String, Error> {
    String::from_utf8(read(path, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_up_to_the_limit_and_refuses_more() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read(&file, 5).unwrap(), b"12345");
        assert!(matches!(read(&file, 4), Err(Error::TooLarge { limit: 4 })));
        assert!(matches!(
            read(Path::new("/dev/zero"), 1 << 16),
            Err(Error::TooLarge { limit: 65536 })
        ));
        assert!(matches!(
            read(&dir.path().join("none"), 5),
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound
        ));
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_to_string(&file, 5),
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::InvalidData
        ));
    }
}
