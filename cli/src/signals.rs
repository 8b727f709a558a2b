//! Stopping on a signal: a long-running command (`serve`, `top`) catches the signals it
//! names and polls [`stopped`] in its loop, so it ends its work and cleans up rather than
//! dying mid-way.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// Set by a caught signal.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store. Relaxed: a flag the loop polls, ordering nothing.
    STOP.store(true, Ordering::Relaxed);
}

/// Catches `signals`: from then on each sets the flag [`stopped`] reads.
///
/// # Errors
/// What `sigaction` fails with.
pub(crate) fn catch(signals: &[Signal]) -> nix::Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for &sig in signals {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

/// Whether a caught signal came.
pub(crate) fn stopped() -> bool {
    // Relaxed: see `on_signal`.
    STOP.load(Ordering::Relaxed)
}
