//! The `tracing` context a device thread starts with (the `tracing` feature): the subscriber
//! that was current where the thread was started, and a span the thread's events sit in.
//!
//! A subscriber installed for one scope (`tracing::subscriber::set_default`, `with_default`)
//! belongs to the thread that installed it; a global one (what the command-line tool installs)
//! reaches every thread anyway. The device's units run on threads of their own, so without
//! this their events (queues they fault, translation faults) would reach a global subscriber
//! only. Nothing is carried when no subscriber is current, so a program without one pays
//! nothing for it on the device's threads.

use tracing::dispatcher::{self, DefaultGuard, Dispatch};
use tracing::span::EnteredSpan;
use tracing::subscriber::NoSubscriber;
use tracing::Span;

/// What a new thread takes along: the current subscriber (if any) and a span to enter.
#[derive(Debug)]
pub(crate) struct Carried {
    dispatch: Option<Dispatch>,
    span: Span,
}

/// A thread's context, entered: the span is left, then the subscriber uninstalled, on drop.
#[derive(Debug)]
pub(crate) struct Entered {
    // Field order is drop order: the span is exited while its subscriber is still installed.
    _span: EnteredSpan,
    _guard: Option<DefaultGuard>,
}

impl Carried {
    /// The calling thread's subscriber, with `span` (made on this thread, so under it).
    pub(crate) fn new(span: Span) -> Carried {
        let dispatch = dispatcher::get_default(|d| (!d.is::<NoSubscriber>()).then(|| d.clone()));
        Carried { dispatch, span }
    }

    /// Installs the subscriber on the calling thread (the new one) and enters the span.
    pub(crate) fn enter(self) -> Entered {
        let guard = self.dispatch.as_ref().map(dispatcher::set_default);
        Entered {
            _span: self.span.entered(),
            _guard: guard,
        }
    }
}
