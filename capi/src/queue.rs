//! Queues: descriptors with the buffers they name go in, completions with those buffers come
//! out. Submitting moves a buffer into the queue (its handle then says `UDMA_BUFFER_IN_QUEUE`
//! and it cannot be freed, read or written through the library); its completion moves it
//! back, under the same handle.
//!
//! Each queue is behind a mutex: calls on one queue from several threads are serialized (a
//! queue is best used by one thread). Locks are always taken queue first, then the buffer
//! table, never the other way round.

// cbindgen writes the header's declarations in the order it reads them, modules in the order
// they are declared: those with `udma_*` functions are declared (a group each, which rustfmt
// keeps) in the order of those functions in the header.
#[path = "queue/lifecycle.rs"]
mod lifecycle;

#[path = "queue/submit.rs"]
mod submit;

#[path = "queue/completion.rs"]
mod completion;

#[path = "queue/interrupt.rs"]
mod interrupt;

#[path = "queue/info.rs"]
mod info;

#[path = "queue/op.rs"]
mod op;

pub use completion::{udma_completion, udma_queue_poll, udma_queue_wait, udma_queue_wait_any};
pub(crate) use info::op_status;
pub use info::{udma_op_status_name, udma_queue_get_info, udma_queue_info};
pub use interrupt::{udma_queue_arm, udma_queue_disarm, udma_queue_interrupt_fd};
pub use lifecycle::{
    udma_queue, udma_queue_create, udma_queue_destroy, udma_queue_options, udma_unit,
    UDMA_QUEUE_POLL,
};
pub use op::{udma_op, udma_opcode};
pub use submit::{udma_queue_flush, udma_queue_push, udma_queue_submit};
