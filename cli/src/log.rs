//! `--log FILTER`: the libraries' `tracing` spans and events (docs/tracing-events.md) as text
//! on stderr, one line per event with the spans it happened in. Without `--log` nothing is
//! installed: the events cost one comparison each, and the frame paths have none.

use crate::exit::Failure;

/// What `--log` takes: a level for everything (`info`, `debug`, ...) or levels per target
/// (`warn,userdma_infer=debug`), as `tracing_subscriber::filter::Targets` parses them.
#[cfg(feature = "tracing")]
pub(crate) type Filter = tracing_subscriber::filter::Targets;

/// What `--log` takes in a tool built without the `tracing` feature: refused when used.
#[cfg(not(feature = "tracing"))]
pub(crate) type Filter = String;

/// Installs the stderr subscriber for `filter`, if `--log` was given.
pub(crate) fn install(filter: Option<&Filter>) -> Result<(), Failure> {
    let Some(filter) = filter else {
        return Ok(());
    };
    #[cfg(feature = "tracing")]
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(filter.clone())
            .try_init()
            .map_err(|err| Failure::Usage(format!("--log: {err}")))
    }
    #[cfg(not(feature = "tracing"))]
    Err(Failure::Usage(format!(
        "--log {filter}: this userdma was built without the `tracing` feature (cargo build -p userdma-cli --features tracing)"
    )))
}
