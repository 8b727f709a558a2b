//! The error convention: every fallible call returns a [`udma_status`] (0 is success), and
//! [`udma_last_error`] gives the message of the last failure on the calling thread. Every entry
//! point runs inside [`call`], which turns a failure into both and a panic into
//! `UDMA_ERR_INTERNAL`: no panic unwinds into C.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

#[cfg(not(loom))]
use udma::Code;

/// What a call returns: `UDMA_OK` (0), or why it failed. The values 1 to 9 are those of
/// userdma's error codes and never change; a new kind of failure gets a new value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum udma_status {
    /// Success.
    UDMA_OK = 0,
    /// An argument or option out of range, a NULL out-parameter, malformed input (a BDF, a
    /// tensor list), a buffer range past its end.
    UDMA_ERR_INVALID_ARGUMENT = 1,
    /// No such device, BAR, queue, vector, mapping or tensor.
    UDMA_ERR_NOT_FOUND = 2,
    /// Refused: permission, an IOMMU group not viable, a policy (no-IOMMU not allowed).
    UDMA_ERR_REFUSED = 3,
    /// In use: a queue already open, a buffer the device owns (in a queue), a pool with
    /// buffers out.
    UDMA_ERR_BUSY = 4,
    /// Out of something: buffers, IOVA space, device memory, ring slots, hugepages.
    UDMA_ERR_EXHAUSTED = 5,
    /// A wait passed its deadline.
    UDMA_ERR_TIMEOUT = 6,
    /// The device misbehaved: a fault, a protocol violation, it stopped.
    UDMA_ERR_DEVICE = 7,
    /// The device, the kernel or this version of the library cannot do it.
    UDMA_ERR_UNSUPPORTED = 8,
    /// A system call failed for another reason.
    UDMA_ERR_SYSTEM = 9,
    /// The device was removed (hot-unplugged, unbound, asked back by the kernel): destroy what
    /// uses it (buffers come back) and open it again once it is back.
    UDMA_ERR_REMOVED = 10,
    /// A handle that is NULL, of another kind, destroyed (or freed) already, or not made by
    /// this library.
    UDMA_ERR_INVALID_HANDLE = 100,
    /// A bug in the library (it panicked); the message says where. Please report it.
    UDMA_ERR_INTERNAL = 101,
}

impl udma_status {
    /// The status of a userdma error code.
    #[cfg(not(loom))]
    pub(crate) fn of(code: Code) -> udma_status {
        // Exhaustive: a new `Code` must get its status here.
        match code {
            Code::InvalidArgument => udma_status::UDMA_ERR_INVALID_ARGUMENT,
            Code::NotFound => udma_status::UDMA_ERR_NOT_FOUND,
            Code::Refused => udma_status::UDMA_ERR_REFUSED,
            Code::Busy => udma_status::UDMA_ERR_BUSY,
            Code::Exhausted => udma_status::UDMA_ERR_EXHAUSTED,
            Code::Timeout => udma_status::UDMA_ERR_TIMEOUT,
            Code::Device => udma_status::UDMA_ERR_DEVICE,
            Code::Unsupported => udma_status::UDMA_ERR_UNSUPPORTED,
            Code::System => udma_status::UDMA_ERR_SYSTEM,
            Code::Removed => udma_status::UDMA_ERR_REMOVED,
        }
    }

    fn name(self) -> &'static std::ffi::CStr {
        match self {
            udma_status::UDMA_OK => cstr(b"UDMA_OK\0"),
            udma_status::UDMA_ERR_INVALID_ARGUMENT => cstr(b"UDMA_ERR_INVALID_ARGUMENT\0"),
            udma_status::UDMA_ERR_NOT_FOUND => cstr(b"UDMA_ERR_NOT_FOUND\0"),
            udma_status::UDMA_ERR_REFUSED => cstr(b"UDMA_ERR_REFUSED\0"),
            udma_status::UDMA_ERR_BUSY => cstr(b"UDMA_ERR_BUSY\0"),
            udma_status::UDMA_ERR_EXHAUSTED => cstr(b"UDMA_ERR_EXHAUSTED\0"),
            udma_status::UDMA_ERR_TIMEOUT => cstr(b"UDMA_ERR_TIMEOUT\0"),
            udma_status::UDMA_ERR_DEVICE => cstr(b"UDMA_ERR_DEVICE\0"),
            udma_status::UDMA_ERR_UNSUPPORTED => cstr(b"UDMA_ERR_UNSUPPORTED\0"),
            udma_status::UDMA_ERR_SYSTEM => cstr(b"UDMA_ERR_SYSTEM\0"),
            udma_status::UDMA_ERR_REMOVED => cstr(b"UDMA_ERR_REMOVED\0"),
            udma_status::UDMA_ERR_INVALID_HANDLE => cstr(b"UDMA_ERR_INVALID_HANDLE\0"),
            udma_status::UDMA_ERR_INTERNAL => cstr(b"UDMA_ERR_INTERNAL\0"),
        }
    }
}

/// A failure on its way to C: the status and the message.
///
/// Boxed, so that a `Result<T, Fail>` of a small `T` is returned in registers: the hot paths
/// (a buffer allocated and freed) pass results through several calls, and moving a
/// three-word error through memory at each one cost more than the work itself. A failure
/// allocates its message anyway.
#[derive(Debug)]
pub(crate) struct Fail(Box<Failure>);

/// What a [`Fail`] carries.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: udma_status,
    pub(crate) message: String,
}

impl std::ops::Deref for Fail {
    type Target = Failure;

    fn deref(&self) -> &Failure {
        &self.0
    }
}

impl std::ops::DerefMut for Fail {
    fn deref_mut(&mut self) -> &mut Failure {
        &mut self.0
    }
}

impl Fail {
    #[cold]
    pub(crate) fn new(status: udma_status, message: impl Into<String>) -> Fail {
        Fail(Box::new(Failure {
            status,
            message: message.into(),
        }))
    }

    #[cold]
    pub(crate) fn invalid(message: impl Into<String>) -> Fail {
        Fail::new(udma_status::UDMA_ERR_INVALID_ARGUMENT, message)
    }

    pub(crate) fn handle(message: impl Into<String>) -> Fail {
        Fail::new(udma_status::UDMA_ERR_INVALID_HANDLE, message)
    }

    /// A NULL out-parameter or input pointer named `what`.
    pub(crate) fn null(what: &str) -> Fail {
        Fail::invalid(format!("{what} is NULL"))
    }

    /// The same failure, its message prefixed with where it happened (`on loopback0`).
    pub(crate) fn context(mut self, context: impl std::fmt::Display) -> Fail {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

/// The whole chain of an error: its message, then each cause (the failing system call) not
/// already in it.
#[cfg(not(loom))]
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// The Rust API's names in the library's messages, and what a C program calls instead: a
/// C caller told to "drop its ring::Queue" or to use `Results::Copy` could not act on it.
/// Most specific first (a phrase goes before a name inside it).
pub(crate) const C_NAMES: &[(&str, &str)] = &[
    // Queues.
    (
        "(Queue::push_wait waits for them)",
        "(udma_queue_poll or udma_queue_wait takes them)",
    ),
    ("(Queue::push_wait)", "(udma_queue_poll, udma_queue_wait)"),
    (
        "(Queue::shutdown hands every payload back)",
        "(udma_queue_destroy hands every buffer back)",
    ),
    ("(`Queue::shutdown`)", "(udma_queue_destroy)"),
    (
        "drop its ring::Queue first",
        "destroy its queue first (udma_queue_destroy)",
    ),
    // Memory.
    (
        "build it with memory::Backing::Memfd (Runtime::pool and map_memory do)",
        "export memory of udma_memory_map or of a pool (udma_pool_create)",
    ),
    (
        "(build it with memory::Backing::Memfd)",
        "(memory of udma_memory_map or of a pool, udma_pool_create)",
    ),
    (
        "map a larger region, or lower chunk_size / max_class",
        "give the pool more bytes (udma_pool_options.bytes)",
    ),
    (
        "pool::Config::colouring(false) through Runtime::pool_with",
        "udma_pool_options.flags UDMA_POOL_PAGE_ALIGNED",
    ),
    // Opening a device.
    (
        "vfio::Options::allow_noiommu(true) (CLI: --allow-noiommu)",
        "UDMA_PCI_ALLOW_NOIOMMU in udma_pci_options.flags (CLI: --allow-noiommu)",
    ),
    (
        "Options::allow_noiommu(true)",
        "UDMA_PCI_ALLOW_NOIOMMU in udma_pci_options.flags",
    ),
    (
        "(vfio::Options::interrupts, Vfio::enable_interrupts)",
        "(udma_pci_options.irq_kind and irq_count)",
    ),
    (", Loopback::is_running)", ")"),
    // Pipelines and streams.
    ("Results::InPlace", "UDMA_RESULTS_IN_PLACE"),
    ("Results::Copy", "UDMA_RESULTS_COPY"),
    ("Results::Auto", "UDMA_RESULTS_AUTO"),
    (
        "build the pipeline without Config::split",
        "build the pipeline with UDMA_PIPELINE_ONE_QUEUE",
    ),
    ("Streams::new", "udma_streams_create"),
    // The owner's client.
    (
        "Client::connect_wait",
        "udma_owner_connect with udma_owner_options.wait_ns",
    ),
    ("Client::wait", "udma_owner_wait or udma_owner_poll"),
    ("Client::pool", "udma_owner_alloc"),
];

/// `message` with the Rust API's names replaced by the C calls ([`C_NAMES`]).
pub(crate) fn for_c(mut message: String) -> String {
    for (rust, c) in C_NAMES {
        if message.contains(rust) {
            message = message.replace(rust, c);
        }
    }
    message
}

#[cfg(not(loom))]
impl From<udma::Error> for Fail {
    fn from(error: udma::Error) -> Fail {
        Fail::new(udma_status::of(error.code()), for_c(chain(&error)))
    }
}

#[cfg(not(loom))]
impl From<userdma_infer::Error> for Fail {
    fn from(error: userdma_infer::Error) -> Fail {
        Fail::new(udma_status::of(error.code()), for_c(chain(&error)))
    }
}

/// Converts an error of the driver's modules or of the inference layer through the inference
/// layer's [`userdma_infer::Error`] (which passes a driver error through whole).
#[cfg(not(loom))]
pub(crate) fn lib<E: Into<userdma_infer::Error>>(error: E) -> Fail {
    Fail::from(error.into())
}

/// A static C string from its NUL-terminated bytes (written out so that the header generator's
/// parser, which predates `c"..."` literals, reads this crate).
pub(crate) fn cstr(bytes: &'static [u8]) -> &'static std::ffi::CStr {
    std::ffi::CStr::from_bytes_with_nul(bytes).unwrap_or_default()
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: String) {
    let message = CString::new(message).unwrap_or_else(|e| {
        let mut bytes = e.into_vec();
        bytes.retain(|&b| b != 0);
        CString::new(bytes).unwrap_or_default()
    });
    // A thread being torn down has no slot left: the status alone then says what failed.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = message);
}

/// Runs an entry point's body: `Ok` is `UDMA_OK`; a failure sets the thread's last error to
/// `function: message` and returns its status; a panic sets it to the panic's message and
/// returns `UDMA_ERR_INTERNAL`.
#[inline(always)]
pub(crate) fn call(function: &str, body: impl FnOnce() -> Result<(), Fail>) -> udma_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => udma_status::UDMA_OK,
        Ok(Err(fail)) => failed(function, fail),
        Err(panic) => panicked(function, panic),
    }
}

/// A failure's status, its message the thread's last error (out of line: the hot paths of
/// every entry point stay small).
#[cold]
#[inline(never)]
fn failed(function: &str, fail: Fail) -> udma_status {
    set_last_error(format!("{function}: {}", fail.message));
    fail.status
}

#[cold]
#[inline(never)]
fn panicked(function: &str, panic: Box<dyn std::any::Any + Send>) -> udma_status {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    set_last_error(format!(
        "{function}: internal error (a bug in userdma; please report it with this message): \
         {what}"
    ));
    udma_status::UDMA_ERR_INTERNAL
}

/// The message of the last failed call on this thread: what failed, on which device, queue,
/// buffer or IOVA, and what to do. An empty string if no call on this thread has failed. The
/// text stays valid until the next failing call on this thread; copy it to keep it. Successful
/// calls leave it as it was.
#[no_mangle]
pub extern "C" fn udma_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|last| last.borrow().as_ptr())
            .unwrap_or(cstr(b"\0").as_ptr())
    })
    .unwrap_or(cstr(b"\0").as_ptr())
}

/// The name of `status` (`"UDMA_ERR_TIMEOUT"`), a static string; `"UDMA_ERR_UNKNOWN"` for a
/// value that is not a status.
#[no_mangle]
pub extern "C" fn udma_status_name(status: i32) -> *const c_char {
    let all = [
        udma_status::UDMA_OK,
        udma_status::UDMA_ERR_INVALID_ARGUMENT,
        udma_status::UDMA_ERR_NOT_FOUND,
        udma_status::UDMA_ERR_REFUSED,
        udma_status::UDMA_ERR_BUSY,
        udma_status::UDMA_ERR_EXHAUSTED,
        udma_status::UDMA_ERR_TIMEOUT,
        udma_status::UDMA_ERR_DEVICE,
        udma_status::UDMA_ERR_UNSUPPORTED,
        udma_status::UDMA_ERR_SYSTEM,
        udma_status::UDMA_ERR_REMOVED,
        udma_status::UDMA_ERR_INVALID_HANDLE,
        udma_status::UDMA_ERR_INTERNAL,
    ];
    all.into_iter()
        .find(|s| *s as i32 == status)
        .map_or(cstr(b"UDMA_ERR_UNKNOWN\0").as_ptr(), |s| s.name().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: `udma_last_error` returns a NUL-terminated string that lives until the next
        // failing call on this thread; it is copied before any.
        unsafe { std::ffi::CStr::from_ptr(udma_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message_and_failures_keep_theirs() {
        assert_eq!(call("udma_test", || Ok(())), udma_status::UDMA_OK);
        let status = call("udma_test", || panic!("index out of range"));
        assert_eq!(status, udma_status::UDMA_ERR_INTERNAL);
        assert!(last().contains("udma_test: internal error"), "{}", last());
        assert!(last().contains("index out of range"), "{}", last());
        let status = call("udma_test", || Err(Fail::invalid("len 0\0 is too small")));
        assert_eq!(status, udma_status::UDMA_ERR_INVALID_ARGUMENT);
        assert_eq!(last(), "udma_test: len 0 is too small");
        // Success leaves the message of the last failure.
        assert_eq!(call("udma_test", || Ok(())), udma_status::UDMA_OK);
        assert_eq!(last(), "udma_test: len 0 is too small");
    }

    /// Every name the table replaces is gone from what it becomes, no C text names a Rust
    /// path, and errors a C program meets come out in C's words.
    #[test]
    #[cfg(not(loom))]
    fn messages_name_the_c_calls_not_the_rust_api() {
        for (rust, c) in C_NAMES {
            assert!(!c.contains("::"), "{c}");
            let out = for_c(format!("x: {rust}: y"));
            assert!(!out.contains("::"), "{rust} -> {out}");
            assert!(out.contains(c), "{rust} -> {out}");
        }
        let full: Fail = lib(udma::ring::Error::Full { queue: 1, depth: 8 });
        assert_eq!(full.status, udma_status::UDMA_ERR_EXHAUSTED);
        assert!(
            full.message.contains("(udma_queue_poll, udma_queue_wait)"),
            "{}",
            full.message
        );
        let ids: Fail = lib(udma::ring::Error::NoCommandId {
            queue: 1,
            in_flight: 8,
        });
        assert!(
            ids.message.contains("udma_queue_poll or udma_queue_wait"),
            "{}",
            ids.message
        );
        let busy: Fail = lib(udma::device::Error::QueueBusy { queue: 2 });
        assert_eq!(busy.status, udma_status::UDMA_ERR_BUSY);
        assert!(
            busy.message.contains("udma_queue_destroy"),
            "{}",
            busy.message
        );
        for fail in [full, ids, busy] {
            assert!(!fail.message.contains("::"), "{}", fail.message);
        }
    }

    #[test]
    #[cfg(not(loom))]
    fn every_code_has_the_status_of_the_same_number() {
        for code in Code::ALL {
            assert_eq!(udma_status::of(code) as i32, code.raw());
        }
        // SAFETY: static NUL-terminated strings.
        let name = |s| unsafe { std::ffi::CStr::from_ptr(udma_status_name(s)) };
        assert_eq!(name(6).to_str(), Ok("UDMA_ERR_TIMEOUT"));
        assert_eq!(name(-3).to_str(), Ok("UDMA_ERR_UNKNOWN"));
    }
}
