//! A `tracing` subscriber that keeps what it is told, for the tests of the `tracing` features
//! (tests/tracing_events.rs, infer/tests/tracing_events.rs): every span opened, with its
//! fields, and every event, with its fields and the spans it was emitted in.
//!
//! Installed for one test with [`Capture::run`] (`tracing::subscriber::with_default`): it sees
//! the test's thread, and the threads a device starts from it (the loopback device carries the
//! subscriber that was current when it was made to its units' threads).

#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// A span as it was opened (and its fields recorded later).
#[derive(Debug, Clone)]
pub(crate) struct SpanSeen {
    pub(crate) name: &'static str,
    pub(crate) level: Level,
    pub(crate) target: String,
    pub(crate) fields: Vec<(String, String)>,
}

/// An event, with the spans it was emitted in (outermost first).
#[derive(Debug, Clone)]
pub(crate) struct EventSeen {
    pub(crate) message: String,
    pub(crate) level: Level,
    pub(crate) target: String,
    pub(crate) fields: Vec<(String, String)>,
    pub(crate) spans: Vec<SpanSeen>,
}

/// Looks a field up by name in a list of recorded fields.
pub(crate) trait Fields {
    fn fields(&self) -> &[(String, String)];

    /// The field `name`'s value as text (`Display` for `%` fields, `Debug` otherwise; a string
    /// without quotes).
    fn field(&self, name: &str) -> Option<&str> {
        self.fields()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Fields for SpanSeen {
    fn fields(&self) -> &[(String, String)] {
        &self.fields
    }
}

impl Fields for EventSeen {
    fn fields(&self) -> &[(String, String)] {
        &self.fields
    }
}

impl EventSeen {
    /// The innermost span named `name` the event was emitted in.
    pub(crate) fn within(&self, name: &str) -> Option<&SpanSeen> {
        self.spans.iter().rev().find(|s| s.name == name)
    }
}

#[derive(Debug, Default)]
struct State {
    spans: HashMap<u64, SpanSeen>,
    /// Spans in the order they were opened.
    opened: Vec<u64>,
    /// Per thread, the spans entered (innermost last).
    stacks: HashMap<ThreadId, Vec<u64>>,
    events: Vec<EventSeen>,
    next: u64,
}

/// The subscriber; clones share what it kept.
#[derive(Debug, Clone, Default)]
pub(crate) struct Capture {
    state: Arc<Mutex<State>>,
}

impl Capture {
    /// Runs `f` with a new capture installed on this thread; returns its result and the capture.
    pub(crate) fn run<R>(f: impl FnOnce() -> R) -> (R, Capture) {
        let capture = Capture::default();
        let result = tracing::subscriber::with_default(capture.clone(), f);
        (result, capture)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every span opened, in order.
    pub(crate) fn spans(&self) -> Vec<SpanSeen> {
        let state = self.lock();
        state
            .opened
            .iter()
            .map(|id| state.spans[id].clone())
            .collect()
    }

    /// The spans named `name`, in order.
    pub(crate) fn spans_named(&self, name: &str) -> Vec<SpanSeen> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    /// Every event, in order.
    pub(crate) fn events(&self) -> Vec<EventSeen> {
        self.lock().events.clone()
    }

    /// The events whose message is `message`, in order.
    pub(crate) fn events_saying(&self, message: &str) -> Vec<EventSeen> {
        self.events()
            .into_iter()
            .filter(|e| e.message == message)
            .collect()
    }
}

/// Collects the fields of a span or event as text.
#[derive(Default)]
struct Collect {
    message: String,
    fields: Vec<(String, String)>,
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields
                .push((field.name().to_owned(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.fields.push((field.name().to_owned(), text));
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut collect = Collect::default();
        attrs.record(&mut collect);
        let mut state = self.lock();
        state.next += 1;
        let id = state.next;
        let meta = attrs.metadata();
        state.spans.insert(
            id,
            SpanSeen {
                name: meta.name(),
                level: *meta.level(),
                target: meta.target().to_owned(),
                fields: collect.fields,
            },
        );
        state.opened.push(id);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut collect = Collect::default();
        values.record(&mut collect);
        if let Some(seen) = self.lock().spans.get_mut(&span.into_u64()) {
            seen.fields.extend(collect.fields);
        }
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut collect = Collect::default();
        event.record(&mut collect);
        let mut state = self.lock();
        let stack = state
            .stacks
            .get(&std::thread::current().id())
            .cloned()
            .unwrap_or_default();
        let spans = stack.iter().map(|id| state.spans[id].clone()).collect();
        let meta = event.metadata();
        state.events.push(EventSeen {
            message: collect.message,
            level: *meta.level(),
            target: meta.target().to_owned(),
            fields: collect.fields,
            spans,
        });
    }

    fn enter(&self, span: &Id) {
        self.lock()
            .stacks
            .entry(std::thread::current().id())
            .or_default()
            .push(span.into_u64());
    }

    fn exit(&self, span: &Id) {
        let mut state = self.lock();
        if let Some(stack) = state.stacks.get_mut(&std::thread::current().id()) {
            if let Some(at) = stack.iter().rposition(|&id| id == span.into_u64()) {
                stack.remove(at);
            }
        }
    }
}
