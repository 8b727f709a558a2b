//! Why a plot could not be produced: one variant per failing step, each naming the file.

use std::path::PathBuf;

/// Why an [`svg`](super::svg) plot could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Drawing the plot failed (plotters refused an element or the layout).
    #[error("cannot draw the plot for {path}: {reason}; report this with the recorder's frames")]
    Draw {
        /// The file the plot was meant for.
        path: PathBuf,
        /// What plotters said.
        reason: String,
    },
    /// Writing the SVG file failed.
    #[error(
        "cannot write the plot to {path}: {source}; check that the directory exists and is writable"
    )]
    Write {
        /// The file.
        path: PathBuf,
        /// The error from the file system.
        #[source]
        source: std::io::Error,
    },
}
