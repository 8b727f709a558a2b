//! Models and pipelines: `udma_model` (a chain of compute steps, or the YOLOv5s-like graph
//! of the model zoo, with its expected output computed on the host), `udma_pipeline` (frames
//! through H2D, the model's device steps and D2H over preallocated slots on a loopback
//! device), and the frame views callbacks get (`udma_frame_input`, `udma_frame_output`).
//!
//! **Callbacks.** A frame's input is written, and its result read, inside a callback the
//! library calls (`udma_pipeline_fill_fn`, `udma_pipeline_result_fn`, the streams' ones):
//! the view it gets is valid for that call only. Views live in memory the library never
//! frees (`views`), and the thread's record of its running callback says which one is live,
//! so a view kept past its callback, or used on another thread, is refused without reading
//! freed or reused memory (a caller's copy of a view is checked by its token). A
//! callback must return normally: no `longjmp` out of it and no C++ exception through it
//! (either would skip the library's frames, which is undefined behaviour; an exception aborts
//! the process). Inside a callback, the pipeline and streams calls are refused
//! (`UDMA_ERR_BUSY`): they would re-enter the pipeline that is calling.

// cbindgen writes the header's declarations in the order it reads them, modules in the order
// they are declared: these are declared (a group each, which rustfmt keeps) in the order of
// their `udma_*` items in the header.
#[path = "pipeline/model.rs"]
mod model;

#[path = "pipeline/callback.rs"]
mod callback;

#[path = "pipeline/options.rs"]
mod options;

#[path = "pipeline/run.rs"]
mod run;

#[path = "pipeline/views.rs"]
mod views;

pub(crate) use callback::{fill, finish, not_in_callback};
pub use callback::{
    udma_frame_input, udma_frame_input_write, udma_frame_output, udma_frame_output_read,
};
pub use model::{
    udma_model, udma_model_create_chain, udma_model_create_yolov5s, udma_model_destroy,
    udma_model_expected, udma_model_get_info, udma_model_info,
};
pub use options::{
    udma_pipeline_options, udma_results, UDMA_PIPELINE_ONE_QUEUE, UDMA_PIPELINE_POLL,
};
pub use run::{
    udma_pipeline, udma_pipeline_create, udma_pipeline_create_on_engine, udma_pipeline_destroy,
    udma_pipeline_fill_fn, udma_pipeline_flush, udma_pipeline_get_info, udma_pipeline_info,
    udma_pipeline_poll, udma_pipeline_result_fn, udma_pipeline_submit, udma_pipeline_submit_with,
    udma_pipeline_wait, UDMA_COMPUTE_DEVICE, UDMA_COMPUTE_HOST, UDMA_COMPUTE_MIXED,
};
pub(crate) use run::{with_pipeline, PIPELINES};
