/*
 * userdma: drive PCIe accelerators from user space — the C API.
 *
 * Link:   cc app.c $(pkg-config --cflags --libs userdma)
 *
 * Conventions
 *   - Every fallible call returns a udma_status: UDMA_OK (0) or why it failed. After a
 *     failure, udma_last_error() gives this thread's message: what failed, on which device,
 *     queue, buffer or IOVA, and what to do. No panic crosses into C: a bug in the library
 *     returns UDMA_ERR_INTERNAL.
 *   - Results come back through out-parameters. Objects are opaque handles made and destroyed
 *     only by the library, in pairs: udma_device_open_* / udma_device_close,
 *     udma_memory_map / udma_mapping_destroy, udma_pool_create / udma_pool_destroy,
 *     udma_pool_alloc / udma_pool_free, udma_queue_create / udma_queue_destroy,
 *     udma_plan_create / udma_plan_destroy, udma_model_create_* / udma_model_destroy,
 *     udma_pipeline_create / udma_pipeline_destroy (or udma_streams_create, which takes the
 *     pipelines over), udma_streams_create / udma_streams_destroy, udma_owner_connect /
 *     udma_owner_disconnect (a client of a device owner process, `userdma serve`), whose
 *     buffers are udma_owner_alloc / udma_owner_free by offset. Device-memory ranges
 *     are plain structs in a pair too: udma_device_memory_alloc(_at) /
 *     udma_device_memory_free (the device handle checks each one it is given back).
 *   - A PCI device's registers: udma_device_read8/16/32/64 and udma_device_write8/16/32/64
 *     (BAR, offset), checked against the BAR's length and the width's alignment. Its DMA
 *     uses pool buffers and mappings like the loopback device's; its queues are its
 *     driver's (udma_queue_create serves the loopback device only).
 *
 * Handles
 *   A handle is a pointer type, but its value is not an address and is never dereferenced:
 *   it packs a type tag, a slot index and the slot's generation. Every call checks all three,
 *   in release builds too, so a NULL handle, a handle of another type, a handle destroyed
 *   (or a buffer freed) already, and a value the library never made are refused with
 *   UDMA_ERR_INVALID_HANDLE instead of touching memory. Destroying bumps the slot's
 *   generation: a stale copy of a handle stays invalid even after its slot is reused (until
 *   the 32-bit generation wraps). At most 2^24 live handles of each type. 64-bit targets.
 *   Handles may be used from any thread; calls on one queue (or one owner client) are
 *   serialized.
 *
 * Ownership
 *   - A buffer is the caller's while udma_buffer_get_info says UDMA_BUFFER_HOST: read and write it
 *     (through its host address, or udma_buffer_read/_write), submit it, free it.
 *   - Submitting an op moves its buffer into the queue (UDMA_BUFFER_IN_QUEUE): the device owns
 *     it, and freeing, reading or writing it through the library returns UDMA_ERR_BUSY. Its
 *     completion (udma_queue_poll, udma_queue_wait) hands it back under the same handle, and
 *     udma_queue_destroy hands back what was still in flight.
 *   - udma_pool_destroy returns UDMA_ERR_BUSY while any of its buffers is out. Closing a
 *     device does not invalidate what was made from it: each handle keeps what it needs.
 *
 * Callbacks
 *   Pipelines and streams call back into the program to write a frame's input and to take
 *   its result (udma_pipeline_fill_fn, udma_pipeline_result_fn, udma_preprocess_fn,
 *   udma_postprocess_fn), on the calling thread, inside the call that runs them. The
 *   udma_frame_input / udma_frame_output a callback gets is valid during that callback only.
 *   The library keeps views in memory it never frees and knows which one is live on each
 *   thread: a view pointer kept past its callback, or passed to another thread, is refused
 *   (UDMA_ERR_INVALID_ARGUMENT), and checking it reads no freed memory. Inside a later
 *   callback on the same thread (same nesting depth) a kept pointer is that callback's view
 *   again: the same address. A copy of a view is checked by its token. A callback must return
 *   normally: no longjmp out of it, no C++ exception through it (either would skip the
 *   library's frames: undefined behaviour, or an abort). Inside a callback, the frame calls
 *   (udma_frame_input_write, udma_frame_output_read), the model, buffer and error calls are
 *   allowed; pipeline and streams calls return UDMA_ERR_BUSY.
 *
 * Structs that grow
 *   Option, info and op structs start with `size_t size`: set it to sizeof the struct. The
 *   library reads or writes only that many bytes, so a program built against an older,
 *   smaller struct keeps working (the fields it lacks take their defaults), and zero is the
 *   default of every option field: `udma_pool_options o = { .size = sizeof o, .bytes = 1 << 22 };`.
 *
 * Versions
 *   UDMA_VERSION (the header) and udma_version() (the library) are major << 16 | minor << 8
 *   | patch; the shared library's SONAME carries the major version (libuserdma.so.0).
 */


#ifndef USERDMA_H
#define USERDMA_H

/* Generated by cbindgen from capi/src (capi/gen-header.sh): do not edit. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The major version of the header (the library's is `udma_version() >> 16`).
#define UDMA_VERSION_MAJOR 0

// The minor version of the header.
#define UDMA_VERSION_MINOR 1

// The patch version of the header.
#define UDMA_VERSION_PATCH 0

// The header's version as one number, `major << 16 | minor << 8 | patch`: compare it with
// `udma_version()`.
#define UDMA_VERSION (((UDMA_VERSION_MAJOR << 16) | (UDMA_VERSION_MINOR << 8)) | UDMA_VERSION_PATCH)

// `udma_loopback_options.flags`: pin the engine to `engine_cpu`.
#define UDMA_LOOPBACK_PIN_ENGINE 1

// `udma_pci_options.flags`: allow VFIO's no-IOMMU mode (no isolation; the device reaches
// physical addresses). Off by default; the kernel must allow it too
// (`enable_unsafe_noiommu_mode`).
#define UDMA_PCI_ALLOW_NOIOMMU 1

// `udma_pci_options.flags`: use VFIO's container interface even where iommufd exists.
#define UDMA_PCI_NO_IOMMUFD 2

// A timeout that never passes.
#define UDMA_TIMEOUT_INFINITE UINT64_MAX

// The engine runs the model's `COMPUTE` and `LAYER` steps (without it they run on the host).
#define UDMA_ENGINE_COMPUTE 1

// The engine runs `COMPACT` steps (on-device filtering).
#define UDMA_ENGINE_FILTER 2

// Copy and compute are separate units that run at once (queues opened with unit 1 compute).
#define UDMA_ENGINE_SEPARATE_UNITS 4

// A queue's op can wait for another queue's (`UDMA_ENGINE_OP_AFTER`).
#define UDMA_ENGINE_CROSS_QUEUE_ORDER 8

// Arenas are in device memory.
#define UDMA_ENGINE_DEVICE_MEMORY 16

// `read_arena` is cheap enough to read results in place.
#define UDMA_ENGINE_READ_IN_PLACE 32

// Queues run in contexts and the device charges switches between them.
#define UDMA_ENGINE_CONTEXTS 64

// `udma_engine_op::kind`: copy `len` bytes from the host buffer to arena address `arena_at`.
#define UDMA_ENGINE_OP_TO_DEVICE 1

// `udma_engine_op::kind`: copy `len` bytes at arena address `arena_at` to the host buffer.
#define UDMA_ENGINE_OP_TO_HOST 2

// `udma_engine_op::kind`: run step `step` over the arena at `arena_at` (offsets from there).
#define UDMA_ENGINE_OP_STEP 3

// `udma_engine_op::kind`: wait until the first `after_count` ops pushed to queue
// `after_queue` (since it was opened) completed.
#define UDMA_ENGINE_OP_AFTER 4

// `udma_engine_op::step`: each little-endian 32-bit word `w` of `len` bytes at `src` becomes
// `(w ^ xor_mask) + add` at `dst`.
#define UDMA_ENGINE_STEP_COMPUTE 1

// `udma_engine_op::step`: a model layer, the loopback NPU's `Layer` (inputs, `seed`).
#define UDMA_ENGINE_STEP_LAYER 2

// `udma_engine_op::step`: on-device filtering, the loopback NPU's `Compact`.
#define UDMA_ENGINE_STEP_COMPACT 3

// `udma_pool_options.flags`: cache colouring. Buffers of 4 KiB and up (where it costs at
// most one block in 16 of a chunk) are placed `size + 256` bytes apart instead of `size`, so
// that their first cache lines spread over the CPU's cache sets: faster when the CPU touches
// many buffers in a row (filling a bulk allocation, reading a burst's headers). Those buffers
// are then aligned to 256 bytes, not to their size. Without a flag a pool is coloured when its
// device takes 256-byte aligned buffers (the loopback NPU) and page aligned otherwise; this
// flag on a device that needs more than 256 bytes is `UDMA_ERR_INVALID_ARGUMENT`.
#define UDMA_POOL_COLOURED 1

// `udma_pool_options.flags`: no cache colouring, whatever the device allows: every buffer
// aligned to its size class (4 KiB buffers to a page), for buffers that must be page aligned
// (a file opened with `O_DIRECT`, page lists) on a device that would take less.
#define UDMA_POOL_PAGE_ALIGNED 2

// `udma_pipeline_options.flags`: every descriptor on one queue, in order (by default three
// queues on the device's two units, so copying and computing overlap).
#define UDMA_PIPELINE_ONE_QUEUE 1

// `udma_pipeline_options.flags`: poll for completions instead of sleeping on interrupts.
#define UDMA_PIPELINE_POLL 2

// `udma_pipeline_info::compute`: every step on the device.
#define UDMA_COMPUTE_DEVICE 0

// `udma_pipeline_info::compute`: every step on the host, between the device's transfers.
#define UDMA_COMPUTE_HOST 1

// `udma_pipeline_info::compute`: some steps on the device, the others on the host.
#define UDMA_COMPUTE_MIXED 2

// `udma_tensor.flags`: the tensor is pinned at `offset`.
#define UDMA_TENSOR_FIXED 1

// The most input ids one tensor's op may name.
#define UDMA_TENSOR_MAX_INPUTS 4096

// `udma_plan_options.flags`: let a tensor take over a dying input of its op
// (`udma_tensor.op`, `.inputs`, `.inplace`).
#define UDMA_PLAN_INPLACE 1

// `udma_plan_options.flags`: do not let aliasing ops (`Reshape`, ...) share their input's
// memory.
#define UDMA_PLAN_NO_ALIAS 2

// `udma_queue_options.flags`: no interrupt; waits poll (and `udma_queue_wait_any` refuses
// the queue).
#define UDMA_QUEUE_POLL 1

// `udma_dmabuf_export_*` flag: every importer only DMAs through the buffer (a NIC, a GPU, a
// device's DMA engine), none maps it into the kernel; allows memory in huge pages on kernels
// whose udmabuf maps huge pages into the kernel wrongly (before 6.17).
#define UDMA_DMABUF_DMA_ONLY 1

// The most items one message carries.
#define UDMA_SHARE_MAX_ITEMS 16

// What a device may do with a mapping (`udma_memory_map_user_access`, `udma_dmabuf_import`).
// The IOMMU enforces it (VFIO type1 and iommufd; the loopback NPU's table); a device without
// an IOMMU refuses all but read-write.
typedef enum udma_access {
  // The device reads and writes the memory.
  UDMA_ACCESS_READ_WRITE = 0,
  // The device only reads it: its writes are refused and the memory is unchanged.
  UDMA_ACCESS_DEVICE_READS = 1,
  // The device only writes it: its reads are refused.
  UDMA_ACCESS_DEVICE_WRITES = 2,
} udma_access;

// Where a buffer is (`udma_buffer_info.state`).
typedef enum udma_buffer_state {
  // On the host: read it, write it, submit it, free it.
  UDMA_BUFFER_HOST = 0,
  // In a queue: the device's until its completion; not to be touched.
  UDMA_BUFFER_IN_QUEUE = 1,
} udma_buffer_state;

// The loopback device's cost model (`udma_loopback_options.cost_model`).
typedef enum udma_cost_model {
  // A small NPU behind PCIe (the default): 12 GB/s DMA, 1 µs a descriptor, 6 GB/s compute,
  // 20 µs a context switch; the engine holds each completion back until its modelled time.
  UDMA_COST_NPU = 0,
  // No cost: the engine runs as fast as the host can and never waits (tests).
  UDMA_COST_ZERO = 1,
} udma_cost_model;

// `udma_device_info.kind`.
typedef enum udma_device_kind {
  // The software loopback device.
  UDMA_DEVICE_LOOPBACK = 0,
  // A PCI function bound to vfio-pci.
  UDMA_DEVICE_VFIO = 1,
  // A PCI function bound to uio_pci_generic.
  UDMA_DEVICE_UIO = 2,
} udma_device_kind;

// What happened to a device (`udma_event.kind`).
typedef enum udma_event_kind {
  // Nothing new (the wait timed out).
  UDMA_EVENT_NONE = 0,
  // The device was removed (hot-unplugged, unbound, asked back by the kernel): its queues
  // stopped, every call that needs it fails with `UDMA_ERR_REMOVED`; destroy what uses it
  // (buffers in flight come back as the queues are destroyed).
  UDMA_EVENT_REMOVAL = 1,
  // The device reported errors (PCIe AER error interrupts): `count` new, `total` in all.
  UDMA_EVENT_ERROR = 2,
} udma_event_kind;

// `udma_pci_options.irq_kind`.
typedef enum udma_irq_kind {
  // No interrupts enabled at open (the default).
  UDMA_IRQ_NONE = 0,
  // Legacy INTx (one vector).
  UDMA_IRQ_INTX = 1,
  // MSI (up to 32 vectors).
  UDMA_IRQ_MSI = 2,
  // MSI-X (up to 2048 vectors).
  UDMA_IRQ_MSIX = 3,
} udma_irq_kind;

// What an op does (`udma_op.opcode`): the loopback device's opcodes.
typedef enum udma_opcode {
  // Nothing (a marker in the queue's order).
  UDMA_OP_NOP = 0,
  // Host to device: `len` bytes of `buffer` at `buffer_offset` to device memory at
  // `device_offset`.
  UDMA_OP_TO_DEVICE = 1,
  // Device to host: `len` bytes of device memory at `device_offset` into `buffer` at
  // `buffer_offset`.
  UDMA_OP_TO_HOST = 2,
  // `len` bytes within device memory, from `device_src` to `device_offset`.
  UDMA_OP_DEVICE_COPY = 3,
  // `len` bytes of device memory at `device_offset` set to the byte `arg0`.
  UDMA_OP_FILL = 4,
  // Each 32-bit word `w` of the `len` bytes at `device_src` becomes `(w ^ arg0) + arg1` at
  // `device_offset` (all multiples of 4); the completion's result is the sum of the words
  // written.
  UDMA_OP_COMPUTE = 5,
  // Waits until queue `arg0` of the device has completed `arg1` descriptors.
  UDMA_OP_WAIT = 6,
  // A model layer: `len` bytes of output at `device_offset` from up to three input tensors
  // in device memory: input 0 at `device_src`, `arg0` bytes (required); input 1 at `arg1`,
  // `arg2` bytes; input 2 at `arg3`, `arg4` bytes (a length of 0: the input is absent, and
  // its offset must be 0; input 2 only with input 1); the layer's seed in `arg5` (32 bits).
  // Output word `j` (little-endian `u32`) is `mix(seed, j, w_0, w_1, ...)` of word
  // `j mod words_k` of each present input `k` (a shorter input repeats), where `mix` starts
  // from `h = seed ^ (j * 0x9e3779b9)` and takes each word `w` as
  // `h = rotl32((h ^ w) * 0x85ebca6b, 13)` (all 32-bit). Every offset and length a multiple
  // of 4 (else the completion says `misaligned`), the output overlapping no input (else
  // `overlap`). The completion's result is the wrapping 64-bit sum of the output words.
  UDMA_OP_LAYER = 7,
  // Result filtering: of the `len` bytes at `device_src`, read as records of `arg0` bytes
  // (4 to 4096, a multiple of 4; `len` a multiple of it), keeps those whose little-endian
  // `u32` score at byte `arg1` of the record (a multiple of 4, inside it) is at least `arg2`;
  // writes at `device_offset` (`8 + arg3 * arg0` bytes, overlapping no input) the `u32`
  // count of survivors written (at most the capacity `arg3`), the `u32` count found
  // (saturating), then the first survivors in input order, packed, and zeros in the slots
  // left over. The completion's result is the count found. `arg0` to `arg3` are 32-bit.
  UDMA_OP_COMPACT = 8,
} udma_opcode;

// A `udma_owner_event`'s `kind`: what the owner told its clients.
typedef enum udma_owner_event_kind {
  // No event waiting.
  UDMA_OWNER_EVENT_NONE = 0,
  // The device was reset after a fault (`detail`: the fault's code): frames in flight
  // completed with `UDMA_OWNER_STATUS_LOST`; submit them again.
  UDMA_OWNER_EVENT_RESET = 1,
  // The device was removed: no more frames run; connect to an owner of another device.
  UDMA_OWNER_EVENT_REMOVED = 2,
  // The owner is shutting down: disconnect, and connect again (with `wait_ns`) once it is
  // back.
  UDMA_OWNER_EVENT_SHUTDOWN = 3,
} udma_owner_event_kind;

// A completion's `status`: the frame ran, or why not.
typedef enum udma_owner_status {
  // The frame ran; its result is in the result buffer.
  UDMA_OWNER_STATUS_OK = 0,
  // The device failed the frame; the result buffer holds no result.
  UDMA_OWNER_STATUS_FAILED = 1,
  // The frame was in flight when the device was reset: submit it again.
  UDMA_OWNER_STATUS_LOST = 2,
  // The owner refused the submission: a stream this client did not declare (or closed), or
  // an input or result span outside this client's pool or shorter than the model needs.
  // Nothing was read or written.
  UDMA_OWNER_STATUS_REFUSED = 3,
  // The device was removed: no more frames run.
  UDMA_OWNER_STATUS_REMOVED = 4,
  // The stream was closed before the frame ran.
  UDMA_OWNER_STATUS_CLOSED = 5,
} udma_owner_status;

// `udma_memory_map`'s and `udma_pool_options`' page size.
typedef enum udma_page_size {
  // The CPU's base pages (4 KiB): no hugepages needed, IOVA-contiguous per page only.
  UDMA_PAGE_BASE = 0,
  // 2 MiB hugepages (reserve them first: `userdma hugepages`).
  UDMA_PAGE_2M = 1,
  // 1 GiB hugepages.
  UDMA_PAGE_1G = 2,
} udma_page_size;

// `udma_pci_options.backend`: which kernel driver's interface to use.
typedef enum udma_pci_backend {
  // The one the function is bound to: vfio-pci or uio_pci_generic (the default).
  UDMA_PCI_AUTO = 0,
  // vfio-pci.
  UDMA_PCI_VFIO = 1,
  // uio_pci_generic (no IOMMU: physical addresses, pinned memory).
  UDMA_PCI_UIO = 2,
} udma_pci_backend;

// `udma_plan_options.strategy` (and `udma_plan_report.strategy`).
typedef enum udma_plan_strategy {
  // Every heuristic, then the exact search; the report names the winner (the default).
  UDMA_PLAN_AUTO = 0,
  // Conflict graph and greedy colouring.
  UDMA_PLAN_COLOUR = 1,
  // Non-increasing size, smallest fitting gap (TFLite's arena planner).
  UDMA_PLAN_GREEDY_SIZE = 2,
  // In production order, the lowest fitting offset.
  UDMA_PLAN_FIRST_FIT = 3,
  // Online best fit.
  UDMA_PLAN_BEST_FIT = 4,
  // Branch and bound from the best heuristic, to the lower bound or the budget.
  UDMA_PLAN_EXACT = 5,
} udma_plan_strategy;

// `udma_streams_options.policy`: how the next stream is chosen.
typedef enum udma_policy {
  // One frame per stream in turn, priorities ignored (the default).
  UDMA_POLICY_ROUND_ROBIN = 0,
  // The highest priority first, equal priorities in turn; lower streams can starve.
  UDMA_POLICY_STRICT_PRIORITY = 1,
  // Priority with batch switching: a stream keeps the device for up to `batch_k` frames
  // while another waits, then a waiting lower stream gets a batch; none starves.
  UDMA_POLICY_BATCH = 2,
} udma_policy;

// `udma_pipeline_options.results`: how results reach the host.
typedef enum udma_results {
  // Measure both ways for the model's result size when the pipeline is made, use the
  // faster (the default).
  UDMA_RESULTS_AUTO = 0,
  // A D2H copy into a host buffer.
  UDMA_RESULTS_COPY = 1,
  // Read in place from device memory through the BAR (no D2H descriptor).
  UDMA_RESULTS_IN_PLACE = 2,
} udma_results;

// What a `udma_share_item` is.
typedef enum udma_share_kind {
  // A region's memfd (`udma_mapping_fd`): `len` bytes of `page_size` pages.
  UDMA_SHARE_REGION = 1,
  // A dma-buf of `len` bytes.
  UDMA_SHARE_DMABUF = 2,
  // A fence.
  UDMA_SHARE_FENCE = 3,
} udma_share_kind;

// What a call returns: `UDMA_OK` (0), or why it failed. The values 1 to 9 are those of
// userdma's error codes and never change; a new kind of failure gets a new value.
typedef enum udma_status {
  // Success.
  UDMA_OK = 0,
  // An argument or option out of range, a NULL out-parameter, malformed input (a BDF, a
  // tensor list), a buffer range past its end.
  UDMA_ERR_INVALID_ARGUMENT = 1,
  // No such device, BAR, queue, vector, mapping or tensor.
  UDMA_ERR_NOT_FOUND = 2,
  // Refused: permission, an IOMMU group not viable, a policy (no-IOMMU not allowed).
  UDMA_ERR_REFUSED = 3,
  // In use: a queue already open, a buffer the device owns (in a queue), a pool with
  // buffers out.
  UDMA_ERR_BUSY = 4,
  // Out of something: buffers, IOVA space, device memory, ring slots, hugepages.
  UDMA_ERR_EXHAUSTED = 5,
  // A wait passed its deadline.
  UDMA_ERR_TIMEOUT = 6,
  // The device misbehaved: a fault, a protocol violation, it stopped.
  UDMA_ERR_DEVICE = 7,
  // The device, the kernel or this version of the library cannot do it.
  UDMA_ERR_UNSUPPORTED = 8,
  // A system call failed for another reason.
  UDMA_ERR_SYSTEM = 9,
  // The device was removed (hot-unplugged, unbound, asked back by the kernel): destroy what
  // uses it (buffers come back) and open it again once it is back.
  UDMA_ERR_REMOVED = 10,
  // A handle that is NULL, of another kind, destroyed (or freed) already, or not made by
  // this library.
  UDMA_ERR_INVALID_HANDLE = 100,
  // A bug in the library (it panicked); the message says where. Please report it.
  UDMA_ERR_INTERNAL = 101,
} udma_status;

// `udma_tensor.inplace`: whether the tensor may be written over a dying input of its op.
typedef enum udma_tensor_inplace {
  // The op table decides (element-wise ops such as `Relu`, `Add` may; the default).
  UDMA_INPLACE_TABLE = 0,
  // Never over an input.
  UDMA_INPLACE_FORBID = 1,
  // Over an input of at least its size, whatever its op.
  UDMA_INPLACE_ALLOW = 2,
} udma_tensor_inplace;

// `udma_tensor.kind`.
typedef enum udma_tensor_kind {
  // Produced and consumed inside the model (the default).
  UDMA_TENSOR_INTERMEDIATE = 0,
  // A graph input, written by the application.
  UDMA_TENSOR_INPUT = 1,
  // A graph output, read by the application after the run.
  UDMA_TENSOR_OUTPUT = 2,
} udma_tensor_kind;

// `udma_queue_options.unit`: which unit of the loopback device serves the queue.
typedef enum udma_unit {
  // The copy (DMA) engine (the default).
  UDMA_UNIT_COPY = 0,
  // The compute unit, which runs concurrently with the copy engine.
  UDMA_UNIT_COMPUTE = 1,
} udma_unit;

// One buffer from a pool: a host address, an IOVA and a length. Made by `udma_pool_alloc`,
// freed by `udma_pool_free`.
typedef struct udma_buffer udma_buffer;

// A device: the loopback device or a PCI function, with everything the library maps for it.
// Made by `udma_device_open_loopback` or `udma_device_open_pci`, destroyed by
// `udma_device_close`.
typedef struct udma_device udma_device;

// An engine: a device's operations given by a C table. Made by `udma_engine_create`,
// released by `udma_engine_destroy` (pipelines made on it keep it until they are destroyed).
typedef struct udma_engine udma_engine;

// Pinned host memory mapped into a device's DMA space, made by `udma_memory_map`, destroyed
// (unmapped) by `udma_mapping_destroy`.
typedef struct udma_mapping udma_mapping;

// A model a pipeline runs: an arena of device memory, the input tensor, the result tensor
// and the device steps between. Made by `udma_model_create_chain` or
// `udma_model_create_yolov5s`, destroyed by `udma_model_destroy` (a pipeline keeps its own
// copy).
typedef struct udma_model udma_model;

// A connection to a device owner, made by `udma_owner_connect`, closed by
// `udma_owner_disconnect`.
typedef struct udma_owner_client udma_owner_client;

// A pipeline: a model's frames through preallocated slots on a loopback device. Made by
// `udma_pipeline_create`, destroyed by `udma_pipeline_destroy` or moved into a
// `udma_streams` by `udma_streams_create`.
typedef struct udma_pipeline udma_pipeline;

// A plan, made by `udma_plan_create`, destroyed by `udma_plan_destroy`.
typedef struct udma_plan udma_plan;

// A buffer pool over memory mapped once into a device's DMA space, made by
// `udma_pool_create`, destroyed by `udma_pool_destroy` once every buffer is freed.
typedef struct udma_pool udma_pool;

// A hardware queue of a device, made by `udma_queue_create`, destroyed by
// `udma_queue_destroy`.
typedef struct udma_queue udma_queue;

// Streams of pipelines under a scheduler, made by `udma_streams_create` (which takes the
// pipelines over), destroyed by `udma_streams_destroy`.
typedef struct udma_streams udma_streams;

// A BAR of a device (`udma_device_get_bar`).
typedef struct udma_bar_info {
  // `sizeof(udma_bar_info)`.
  size_t size;
  // Bytes of the BAR: offsets `0 .. len - width` are valid for an access of `width` bytes.
  uint64_t len;
  // The BAR's index.
  uint32_t index;
  // Zero.
  uint32_t reserved;
} udma_bar_info;

// How to start the loopback device. Zero is the default for every field: a zeroed struct with
// `size` set is the default device.
typedef struct udma_loopback_options {
  // `sizeof(udma_loopback_options)`.
  size_t size;
  // Bytes of device memory (BAR 2); 0: 64 MiB.
  uint64_t memory_bytes;
  // Queues (and interrupt vectors), 1 to 32; 0: 4.
  uint32_t queues;
  // A `udma_cost_model`; 0: `UDMA_COST_NPU`.
  uint32_t cost_model;
  // The largest queue depth the device accepts (a power of two); 0: 4096.
  uint32_t max_depth;
  // The device's DMA mask width, 12 to 64; 0: 48.
  uint32_t dma_mask_bits;
  // `UDMA_LOOPBACK_PIN_ENGINE` or 0.
  uint32_t flags;
  // With `UDMA_LOOPBACK_PIN_ENGINE`: the CPU the engine runs on.
  uint32_t engine_cpu;
} udma_loopback_options;

// How to open a PCI function. Zero is the default for every field.
typedef struct udma_pci_options {
  // `sizeof(udma_pci_options)`.
  size_t size;
  // A `udma_pci_backend`; 0: `UDMA_PCI_AUTO`.
  uint32_t backend;
  // `UDMA_PCI_ALLOW_NOIOMMU`, `UDMA_PCI_NO_IOMMUFD` (VFIO only), or 0.
  uint32_t flags;
  // The device's DMA mask width (QEMU's edu: 28); 0: 64 for VFIO, 32 for UIO.
  uint32_t dma_mask_bits;
  // A `udma_irq_kind` to enable at open (VFIO only); 0: none.
  uint32_t irq_kind;
  // How many vectors of `irq_kind`.
  uint32_t irq_count;
  // Zero.
  uint32_t reserved;
} udma_pci_options;

// What a device is (`udma_device_get_info`).
typedef struct udma_device_info {
  // `sizeof(udma_device_info)`.
  size_t size;
  // Bytes of device memory the library knows of (the loopback device's BAR 2; 0 for a PCI
  // function).
  uint64_t memory_bytes;
  // A `udma_device_kind`.
  uint32_t kind;
  // Interrupt vectors (one per queue).
  uint32_t vectors;
  // The NUMA node the library places the device's memory on, or -1 for none.
  int32_t numa_node;
  // Zero.
  uint32_t reserved;
  // The device's name (`loopback0`, the PCI address), NUL-terminated, truncated to fit.
  char name[64];
} udma_device_info;

// One event of a device (`udma_device_next_event`).
typedef struct udma_event {
  // `sizeof(udma_event)`.
  size_t size;
  // A `udma_event_kind`.
  uint32_t kind;
  // Zero.
  uint32_t reserved;
  // `UDMA_EVENT_ERROR`: errors new since the handle's last event.
  uint64_t count;
  // `UDMA_EVENT_ERROR`: errors since the device was opened.
  uint64_t total;
} udma_event;

// A range of device memory (`udma_device_memory_alloc`): where it is, and the id the device
// handle knows it by. Pass it back unchanged to `udma_device_memory_free`.
typedef struct udma_range {
  // `sizeof(udma_range)`.
  size_t size;
  // The library's id of the range (never 0).
  uint64_t id;
  // The BAR the range is in.
  uint32_t bar;
  // Zero.
  uint32_t reserved;
  // The first byte's offset in the BAR (the `device_offset` / `device_src` of an op).
  uint64_t offset;
  // Bytes.
  uint64_t len;
} udma_range;

// A BAR's device memory (`udma_device_memory_get_info`).
typedef struct udma_device_memory_info {
  // `sizeof(udma_device_memory_info)`.
  size_t size;
  // Bytes of device memory in all (the BAR's length).
  uint64_t bytes;
  // Bytes free now.
  uint64_t free;
  // The largest free range now (what one allocation can get at most).
  uint64_t largest_free;
  // Ranges this device handle has out.
  uint64_t ranges;
} udma_device_memory_info;

// Opens queue `queue` of `depth` ops (a power of two) in context `context`, served by `unit`
// (0 copy, 1 compute), and sets `*q` to the engine's queue. Returns 0, or an error.
typedef int (*udma_engine_open_queue_fn)(void *user, uint32_t queue, uint32_t depth, uint32_t context, uint32_t unit, void **q);

// One op of a frame, as the engine's `submit` gets it (152 bytes). Which fields mean something depends on
// `kind` (and `step`); the others are zero.
typedef struct udma_engine_op {
  // `UDMA_ENGINE_OP_*`.
  uint32_t kind;
  // `UDMA_ENGINE_STEP_*` for `UDMA_ENGINE_OP_STEP`.
  uint32_t step;
  // Transfers: the host buffer's IOVA in the device's DMA space.
  uint64_t host_iova;
  // Transfers: the host buffer's address in this process.
  void *host;
  // Transfers: bytes; steps: the bytes the step reads (`COMPUTE`, `COMPACT`) or writes
  // (`LAYER`).
  uint64_t len;
  // Transfers: the arena address; steps: the arena's base.
  uint64_t arena_at;
  // Steps: where it reads (`COMPUTE`, `COMPACT`), from `arena_at`.
  uint64_t src;
  // Steps: where it writes, from `arena_at`.
  uint64_t dst;
  // `COMPUTE`: the word mask and addend.
  uint32_t xor_mask;
  // `COMPUTE`: the addend.
  uint32_t add;
  // `LAYER`: the inputs' offsets from `arena_at` (the first `inputs` are present).
  uint64_t input_offset[3];
  // `LAYER`: the inputs' lengths.
  uint64_t input_len[3];
  // `LAYER`: how many inputs (1 to 3).
  uint32_t inputs;
  // `LAYER`: the layer's seed.
  uint32_t seed;
  // `COMPACT`: record size, score offset, threshold and capacity (records kept at most).
  uint32_t record;
  // `COMPACT`: the score's byte offset in a record.
  uint32_t score_at;
  // `COMPACT`: a record survives if its score is at least this.
  uint32_t threshold;
  // `COMPACT`: records kept at most.
  uint32_t capacity;
  // `UDMA_ENGINE_OP_AFTER`: the queue waited for.
  uint32_t after_queue;
  // Zero.
  uint32_t reserved;
  // `UDMA_ENGINE_OP_AFTER`: how many of its ops.
  uint64_t after_count;
} udma_engine_op;

// Queues `op` with `tag` on `q`; it may run at once or at the next `flush`. `op` is valid
// during the call. Returns 0, or an error (a full queue: `UDMA_ERR_EXHAUSTED`).
typedef int (*udma_engine_submit_fn)(void *user, void *q, const struct udma_engine_op *op, uint64_t tag);

// Starts every op submitted to `q` (a doorbell). Returns 0, or an error.
typedef int (*udma_engine_flush_fn)(void *user, void *q);

// A completion, as the engine's `poll` writes it.
typedef struct udma_engine_completion {
  // The tag the op was submitted with.
  uint64_t tag;
  // 0: done; otherwise the engine's status code (named by `status_name`).
  uint32_t status;
  // The engine's id of the op, for messages.
  uint32_t command;
  // A result word (an address or offset for range errors).
  uint64_t result;
} udma_engine_completion;

// Writes `q`'s next completion (in submission order) to `*out` and returns 1; returns 0 when
// none is in, or a negative error.
typedef int (*udma_engine_poll_fn)(void *user, void *q, struct udma_engine_completion *out);

// Stops `q` and frees it: when it returns 0 the engine touches no buffer of `q`'s ops any
// more (the library takes every op that did not complete as aborted). Returns 0, or an
// error (the buffers are then leaked, never reused).
typedef int (*udma_engine_stop_queue_fn)(void *user, void *q);

// Allocates an arena of `bytes` aligned to `align` and sets `*at` to its address as ops name
// it. Returns 0, or an error (out of memory: `UDMA_ERR_EXHAUSTED`).
typedef int (*udma_engine_alloc_arena_fn)(void *user, uint64_t bytes, uint64_t align, uint64_t *at);

// Frees the arena at `at`.
typedef void (*udma_engine_free_arena_fn)(void *user, uint64_t at);

// Reads `len` bytes at arena address `at` into `dst`. Returns 0, or an error.
typedef int (*udma_engine_read_arena_fn)(void *user, uint64_t at, void *dst, size_t len);

// Writes `len` bytes from `src` at arena address `at`. Returns 0, or an error.
typedef int (*udma_engine_write_arena_fn)(void *user, uint64_t at, const void *src, size_t len);

// Resets the device: every queue stops at once. Returns 0, or an error.
typedef int (*udma_engine_reset_fn)(void *user);

// The name of status code `status` (a static string), or NULL.
typedef const char *(*udma_engine_status_name_fn)(void *user, uint32_t status);

// Called once, when the last pipeline on the engine and the engine handle are gone.
typedef void (*udma_engine_destroy_fn)(void *user);

// An engine's functions and capabilities (`udma_engine_create`). Every function but
// `status_name` and `destroy` is required. The library calls them one at a time per engine
// (never two at once), from whichever thread drives a pipeline or resets the device. They may
// call the library's device, register, memory, pool and buffer functions, not the pipeline and
// streams functions of a pipeline on the engine. Each returns 0 or an error: a `udma_status`
// value (from `poll`, its negative) keeps its meaning, anything else is `UDMA_ERR_DEVICE`. A
// queue's ops complete in submission order; the library polls (a C engine raises no
// interrupt the library sleeps on), so `poll` should be cheap when nothing is in.
typedef struct udma_engine_ops {
  // `sizeof(udma_engine_ops)`.
  size_t size;
  // The device's name for messages (copied; NULL: "C engine").
  const char *name;
  // `UDMA_ENGINE_*` capabilities.
  uint32_t flags;
  // Queues, ids 0 to `queues - 1` (at least 1).
  uint32_t queues;
  // Opens a queue.
  udma_engine_open_queue_fn open_queue;
  // Queues an op.
  udma_engine_submit_fn submit;
  // Starts the queued ops.
  udma_engine_flush_fn flush;
  // Takes a completion.
  udma_engine_poll_fn poll;
  // Stops and frees a queue.
  udma_engine_stop_queue_fn stop_queue;
  // Allocates an arena.
  udma_engine_alloc_arena_fn alloc_arena;
  // Frees an arena.
  udma_engine_free_arena_fn free_arena;
  // Reads an arena.
  udma_engine_read_arena_fn read_arena;
  // Writes an arena.
  udma_engine_write_arena_fn write_arena;
  // Resets the device.
  udma_engine_reset_fn reset;
  // Names a status code (optional).
  udma_engine_status_name_fn status_name;
  // Releases `user` (optional).
  udma_engine_destroy_fn destroy;
} udma_engine_ops;

// A mapping's addresses.
typedef struct udma_mapping_info {
  // `sizeof(udma_mapping_info)`.
  size_t size;
  // The host address of byte 0 (the device writes this memory: treat it as volatile).
  void *host;
  // Its length in bytes (the request rounded up to whole pages).
  uint64_t len;
  // The IOVA (device address) of byte 0.
  uint64_t iova;
  // Bytes from byte 0 that are contiguous in IOVA space (the whole length on hugepages
  // or behind an IOMMU; at least one page). `udma_mapping_iova` gives the IOVA of any byte.
  uint64_t contiguous;
} udma_mapping_info;

// How to make a pool. Zero is the default for every field but `bytes`.
typedef struct udma_pool_options {
  // `sizeof(udma_pool_options)`.
  size_t size;
  // Bytes of memory for the pool (required): mapped once, carved into buffers.
  uint64_t bytes;
  // A `udma_page_size`; 0: base pages.
  uint32_t page_size;
  // When nothing is free: 0 fails at once with `UDMA_ERR_EXHAUSTED`; otherwise waits up to
  // this many microseconds for a buffer to be freed first.
  uint32_t wait_us;
  // 0 (the layout the device's DMA alignment calls for), `UDMA_POOL_COLOURED` or
  // `UDMA_POOL_PAGE_ALIGNED`.
  uint32_t flags;
  // Zero.
  uint32_t reserved;
} udma_pool_options;

// A snapshot of a pool's counters (`udma_pool_get_stats`).
typedef struct udma_pool_stats {
  // `sizeof(udma_pool_stats)`.
  size_t size;
  // Bytes buffers are carved from.
  uint64_t arena_bytes;
  // The pool's chunk (slab) size.
  uint64_t chunk_bytes;
  // The largest length `udma_pool_alloc` can ever satisfy.
  uint64_t max_len;
  // Allocations, all sizes (this process).
  uint64_t allocs;
  // Frees, all sizes (this process).
  uint64_t frees;
  // Buffers in use now: `allocs - frees`.
  uint64_t in_use;
  // Allocations served from the thread's cache.
  uint64_t cache_hits;
  // Allocations above the largest size class (whole chunks).
  uint64_t large_allocs;
  // Bytes held by such large buffers now.
  uint64_t large_in_use_bytes;
  // Buffer handles of this pool alive now (on the host or in a queue), and calls holding
  // the pool on other threads (stats, bulk frees): what makes `udma_pool_destroy` busy.
  uint64_t handles;
} udma_pool_stats;

// A buffer's addresses (`udma_buffer_get_info`).
typedef struct udma_buffer_info {
  // `sizeof(udma_buffer_info)`.
  size_t size;
  // The host address of byte 0. Read and write it only while `state` is
  // `UDMA_BUFFER_HOST`: the device may write it while it is in a queue.
  void *host;
  // The IOVA (device address) of byte 0; the buffer is contiguous in IOVA space.
  uint64_t iova;
  // The length asked for.
  uint64_t len;
  // Bytes it can hold (its block size).
  uint64_t capacity;
  // A `udma_buffer_state`.
  uint32_t state;
  // Zero.
  uint32_t reserved;
} udma_buffer_info;

// What a model is (`udma_model_get_info`).
typedef struct udma_model_info {
  // `sizeof(udma_model_info)`.
  size_t size;
  // Bytes of a frame's input.
  uint64_t input_bytes;
  // Bytes of a frame's result.
  uint64_t result_bytes;
  // Bytes of device memory one frame's arena takes (a pipeline takes one per slot).
  uint64_t arena_bytes;
  // Bytes the device computes over per frame (read plus written).
  uint64_t compute_bytes;
  // Device steps per frame.
  uint32_t steps;
  // Zero.
  uint32_t reserved;
} udma_model_info;

// A frame's input, inside a fill or preprocess callback: write it with
// `udma_frame_input_write`. Valid for that callback only: a pointer to it kept past the
// callback still points to readable memory, but every call refuses it (inside a later
// callback at the same nesting depth on the same thread it is that callback's view again,
// the same address). Read its fields inside the callback only, and do not write them.
typedef struct udma_frame_input {
  // `sizeof(udma_frame_input)` of the library.
  size_t size;
  // The frame's number in its pipeline (from 0).
  uint64_t frame;
  // Bytes of the input: write all of them (what is not written keeps an earlier frame's
  // bytes).
  uint64_t len;
  // The library's check that a copy of the view belongs to the running callback (unique
  // in the process, never 0).
  uint64_t token;
} udma_frame_input;

// A finished frame, inside a result or postprocess callback: read its result with
// `udma_frame_output_read`. Valid for that callback only, as `udma_frame_input` is. Read
// its fields inside the callback only, and do not write them.
typedef struct udma_frame_output {
  // `sizeof(udma_frame_output)` of the library.
  size_t size;
  // The frame's number in its pipeline (from 0, in order).
  uint64_t frame;
  // Bytes of the result (0 for a failed frame).
  uint64_t len;
  // Nanoseconds from the start of its preprocessing to its result.
  uint64_t latency_ns;
  // The completion's result field of the failed step (an address or offset), or 0.
  uint64_t fault;
  // 0: the device ran the frame; otherwise the loopback device's code of the step that
  // failed (`udma_op_status_name` names it), and the frame has no result.
  uint32_t status;
  // The step that failed: 0 the H2D copy, then the model's steps, then the D2H copy.
  uint32_t step;
  // The library's check that a copy of the view belongs to the running callback (unique
  // in the process, never 0).
  uint64_t token;
} udma_frame_output;

// How to make a pipeline. Zero is the default for every field.
typedef struct udma_pipeline_options {
  // `sizeof(udma_pipeline_options)`.
  size_t size;
  // Slots (frames in flight at most), 1 to 1024; 0: 2 (double buffering).
  uint32_t depth;
  // Frames per doorbell; 0: 1.
  uint32_t batch;
  // The first of its queues (it takes three, or one with `UDMA_PIPELINE_ONE_QUEUE`).
  uint32_t queue;
  // The device context its queues run in (streams on different contexts make the device
  // switch between them).
  uint32_t context;
  // `UDMA_PIPELINE_ONE_QUEUE`, `UDMA_PIPELINE_POLL`, or 0.
  uint32_t flags;
  // A `udma_results`; 0: `UDMA_RESULTS_AUTO`.
  uint32_t results;
  // How long a wait for a frame may take before it fails; 0: 10 s.
  uint64_t timeout_ns;
  // The context's working set in device SRAM: bytes of its own (0 with `shared` 0:
  // nothing declared).
  uint64_t working_set_private;
  // Bytes shared with contexts of the same `working_set_key` (one model's weights).
  uint64_t working_set_shared;
  // The share key (0: nothing shared).
  uint32_t working_set_key;
  // Zero.
  uint32_t reserved;
} udma_pipeline_options;

// Writes a frame's input (`udma_pipeline_submit_with`): `input` is valid during the call.
typedef void (*udma_pipeline_fill_fn)(void *user, uint64_t frame, struct udma_frame_input *input);

// Takes a finished frame (`udma_pipeline_poll`, `udma_pipeline_wait`): `output` is valid
// during the call.
typedef void (*udma_pipeline_result_fn)(void *user, const struct udma_frame_output *output);

// A pipeline's state (`udma_pipeline_get_info`).
typedef struct udma_pipeline_info {
  // `sizeof(udma_pipeline_info)`.
  size_t size;
  // Frames finished (handed to a result callback, or discarded by destroy).
  uint64_t frames;
  // Frames the device failed.
  uint64_t failed;
  // Doorbells rung.
  uint64_t doorbells;
  // Bytes copied to the device.
  uint64_t bytes_to_device;
  // Bytes of results brought back.
  uint64_t bytes_to_host;
  // Frames in flight now.
  uint32_t in_flight;
  // Slots.
  uint32_t depth;
  // 1 if results are read in place from device memory, 0 if copied back.
  uint32_t in_place;
  // Where the model's steps run: `UDMA_COMPUTE_DEVICE` (0), `UDMA_COMPUTE_HOST` (1: an
  // engine without compute), `UDMA_COMPUTE_MIXED` (2).
  uint32_t compute;
  // Model steps run on the host so far.
  uint64_t host_steps;
} udma_pipeline_info;

// One tensor of the list to plan. Zero (NULL) is the default for every field but `bytes` and
// the interval. The fields from `op` on are for in-place reuse and aliasing
// (`UDMA_PLAN_INPLACE`); a program built against an older header, whose `udma_tensor` ends
// at `flags`, plans as before.
typedef struct udma_tensor {
  // `sizeof(udma_tensor)`: also the stride of the array (every element's `size` must be
  // the first's).
  size_t size;
  // Unique id within the list.
  uint64_t id;
  // Size in bytes (more than zero).
  uint64_t bytes;
  // With `UDMA_TENSOR_FIXED`: its offset in the arena (a multiple of the alignment).
  uint64_t offset;
  // The step that produces it.
  uint32_t first;
  // The last step that reads it (`first <= last`).
  uint32_t last;
  // A `udma_tensor_kind`.
  uint32_t kind;
  // `UDMA_TENSOR_FIXED` or 0.
  uint32_t flags;
  // The producing op's type (`"Relu"`, `"Add"`, `"Reshape"`, ...), a NUL-terminated
  // UTF-8 string read during `udma_plan_create` only; NULL: no op.
  const char *op;
  // The ids of the producing op's inputs, `input_count` of them (NULL when 0), read
  // during `udma_plan_create` only.
  const uint64_t *inputs;
  // How many ids `inputs` holds (at most `UDMA_TENSOR_MAX_INPUTS`).
  uint32_t input_count;
  // A `udma_tensor_inplace`.
  uint32_t inplace;
} udma_tensor;

// How to plan. Zero is the default for every field.
typedef struct udma_plan_options {
  // `sizeof(udma_plan_options)`.
  size_t size;
  // Every offset and size is rounded to this (a power of two); 0: 256.
  uint64_t align;
  // Search nodes the exact search may visit (reproducible on any machine); 0: 100000.
  uint64_t search_nodes;
  // A `udma_plan_strategy`; 0: `UDMA_PLAN_AUTO`.
  uint32_t strategy;
  // `UDMA_PLAN_*` flags; 0: no in-place reuse, aliasing on.
  uint32_t flags;
} udma_plan_options;

// What a plan achieved (`udma_plan_get_report`).
typedef struct udma_plan_report {
  // `sizeof(udma_plan_report)`.
  size_t size;
  // The arena size: the end of the highest tensor.
  uint64_t arena_bytes;
  // No arena can be smaller than this (the peak of live bytes).
  uint64_t lower_bound_bytes;
  // Every tensor in its own range.
  uint64_t naive_bytes;
  // The alignment of every offset.
  uint64_t align;
  // How long planning took, in nanoseconds.
  uint64_t elapsed_ns;
  // The step at which the lower bound's bytes are live.
  uint32_t lower_bound_step;
  // The `udma_plan_strategy` that produced the offsets.
  uint32_t strategy;
  // 1: proven that no smaller arena exists; 0: not proven.
  uint32_t optimal;
  // Tensors planned.
  uint32_t tensors;
} udma_plan_report;

// How to open a queue. Zero is the default for every field.
typedef struct udma_queue_options {
  // `sizeof(udma_queue_options)`.
  size_t size;
  // Entries per ring, a power of two from 2 to the device's largest; 0: 64.
  uint32_t depth;
  // Which of the device's queues (0 to its queue count - 1).
  uint32_t index;
  // The device context descriptors run in (each op's `context` must be this).
  uint32_t context;
  // A `udma_unit`; 0: the copy engine.
  uint32_t unit;
  // `UDMA_QUEUE_POLL` or 0.
  uint32_t flags;
  // Zero.
  uint32_t reserved;
} udma_queue_options;

// One descriptor to submit. Zero is the default for every field.
typedef struct udma_op {
  // `sizeof(udma_op)`.
  size_t size;
  // A `udma_opcode`.
  uint32_t opcode;
  // The device context (the queue's).
  uint32_t context;
  // The host buffer of `UDMA_OP_TO_DEVICE` / `UDMA_OP_TO_HOST` (NULL for the others). It
  // moves into the queue, and comes back with the completion.
  struct udma_buffer *buffer;
  // Where in `buffer` the bytes start.
  uint64_t buffer_offset;
  // The device-memory offset the op writes (reads, for `UDMA_OP_TO_HOST`).
  uint64_t device_offset;
  // The device-memory offset `UDMA_OP_DEVICE_COPY` and `UDMA_OP_COMPUTE` read.
  uint64_t device_src;
  // Bytes.
  uint64_t len;
  // The op's first argument (see `udma_opcode`).
  uint64_t arg0;
  // The op's second argument.
  uint64_t arg1;
  // The caller's tag, handed back in the completion.
  uint64_t user_data;
  // The op's third argument (`UDMA_OP_LAYER`, `UDMA_OP_COMPACT`; a program
  // built with an older, smaller `udma_op` gets 0 here and below).
  uint64_t arg2;
  // The op's fourth argument.
  uint64_t arg3;
  // The op's fifth argument.
  uint64_t arg4;
  // The op's sixth argument.
  uint64_t arg5;
} udma_op;

// A finished op (`udma_queue_poll`, `udma_queue_wait`).
typedef struct udma_completion {
  // `sizeof(udma_completion)`.
  size_t size;
  // The op's `user_data`.
  uint64_t user_data;
  // The op's buffer, on the host again (NULL if it had none).
  struct udma_buffer *buffer;
  // The op's result (`UDMA_OP_COMPUTE`: the sum; an error: the address at fault).
  uint64_t result;
  // The device's status: 0 success; otherwise the loopback device's code
  // (`udma_op_status_name` names it).
  uint32_t status;
  // The command id the queue gave the op.
  uint32_t command_id;
} udma_completion;

// A queue's state (`udma_queue_get_info`).
typedef struct udma_queue_info {
  // `sizeof(udma_queue_info)`.
  size_t size;
  // Ops submitted.
  uint64_t submitted;
  // Completions taken.
  uint64_t completed;
  // Ops in flight (submitted, completion not taken).
  uint32_t in_flight;
  // Entries per ring.
  uint32_t depth;
  // The device's queue index.
  uint32_t index;
  // Zero.
  uint32_t reserved;
} udma_queue_info;

// How to schedule the streams. Zero is the default for every field.
typedef struct udma_streams_options {
  // `sizeof(udma_streams_options)`.
  size_t size;
  // A `udma_policy`; 0: round-robin.
  uint32_t policy;
  // Frames per batch under `UDMA_POLICY_BATCH` (at least 1).
  uint32_t batch_k;
  // Frames on each device at once; 0: 1 (the scheduler decides every frame as the device
  // becomes free, so its wait bounds hold).
  uint32_t in_flight;
  // Zero.
  uint32_t reserved;
} udma_streams_options;

// One stream (`udma_streams_create` takes an array of them). Zero is the default for every
// field but `name` and `pipeline`.
typedef struct udma_stream_options {
  // `sizeof(udma_stream_options)`.
  size_t size;
  // Its name in reports and messages, unique among the streams (copied).
  const char *name;
  // The pipeline its frames run through, with nothing in flight: the streams take it
  // over (its handle is destroyed when `udma_streams_create` succeeds). The stream runs in
  // the pipeline's device context.
  struct udma_pipeline *pipeline;
  // One frame every `period_ns` nanoseconds from the start of a run (a camera); 0: the
  // next frame is ready as soon as the previous one is dispatched (a file played back).
  uint64_t period_ns;
  // A frame that has waited this long runs next, whatever its priority; 0: no maximum.
  uint64_t max_wait_ns;
  // Higher runs first, 0 to 255.
  uint32_t priority;
  // Zero.
  uint32_t reserved;
} udma_stream_options;

// Writes a dispatched frame's input (`udma_streams_run`): `input` is valid during the call.
typedef void (*udma_preprocess_fn)(void *user, uint32_t stream, uint64_t frame, struct udma_frame_input *input);

// Takes a stream's finished frame (`udma_streams_run`): `output` is valid during the call.
typedef void (*udma_postprocess_fn)(void *user, uint32_t stream, const struct udma_frame_output *output);

// What one stream did in a run (`udma_streams_run`).
typedef struct udma_stream_report {
  // `sizeof(udma_stream_report)`.
  size_t size;
  // Frames finished.
  uint64_t frames;
  // Frames the device failed.
  uint64_t failed;
  // Frames that arrived while 256 of its frames were waiting, never run.
  uint64_t dropped;
  // Frames that had arrived but were still waiting when the run ended.
  uint64_t left_waiting;
  // Frames finished per second of the run.
  double fps;
  // Mean latency from arrival to the result handed over, in ns.
  double latency_mean_ns;
  // Its median.
  uint64_t latency_p50_ns;
  // Its 99th percentile.
  uint64_t latency_p99_ns;
  // Its maximum.
  uint64_t latency_max_ns;
  // The longest wait from arrival to dispatch, in ns.
  uint64_t max_wait_ns;
  // Frames in flight when its device failed and was recovered (or removed), never
  // finished. A program built against a header without it passes a smaller size
  // and does not get it.
  uint64_t lost;
} udma_stream_report;

// What a whole run did (`udma_streams_run`).
typedef struct udma_run_report {
  // `sizeof(udma_run_report)`.
  size_t size;
  // Seconds it ran (the duration, plus draining the frames in flight).
  double seconds;
  // Context switches the schedulers' decisions caused.
  uint64_t switches;
  // Decisions made.
  uint64_t decisions;
  // Device faults the run survived (a device reset and its pipelines recovered, or a
  // device removed and its streams stopped while the others went on).
  uint64_t faults;
  // Of those, devices removed.
  uint64_t removals;
  // Of those, devices quarantined: they kept failing (5 faults in a row, or 6 resets of
  // one fault that failed), and their streams get no more frames, in this run or the next.
  // A program built against a header without it passes a smaller size and does not get
  // it.
  uint64_t quarantines;
} udma_run_report;

// One descriptor passed to or from another process, and what it is.
typedef struct udma_share_item {
  // A `udma_share_kind`.
  uint32_t kind;
  // The descriptor (sent: the caller's, kept; received: the caller's to close).
  int32_t fd;
  // Bytes (regions and dma-bufs; 0 for fences).
  uint64_t len;
  // A `udma_page_size` (regions; 0 otherwise).
  uint32_t page_size;
  // Zero.
  uint32_t reserved;
} udma_share_item;

// How to connect (`udma_owner_connect`). Zero is the default for every field.
typedef struct udma_owner_options {
  // `sizeof(udma_owner_options)`.
  size_t size;
  // Bytes of the pool the owner makes for this client (it may give less: its limit);
  // 0: 16 MiB.
  uint64_t pool_bytes;
  // This client's name in the owner's accounting, 1 to 32 bytes of UTF-8 (copied); NULL:
  // the program's name.
  const char *name;
  // How long to keep trying while no owner listens at the socket, in ns (for a program
  // started before its owner, or reconnecting while it restarts); 0: try once;
  // `UDMA_TIMEOUT_INFINITE`: until one does.
  uint64_t wait_ns;
} udma_owner_options;

// A stream to declare (`udma_owner_declare`). Zero is the default for every field but `name`
// and `model`.
typedef struct udma_owner_stream_options {
  // `sizeof(udma_owner_stream_options)`.
  size_t size;
  // Its name, unique among this client's streams, 1 to 32 bytes of UTF-8 (copied).
  const char *name;
  // The model its frames run, by name in the owner's catalogue, 1 to 32 bytes (copied).
  const char *model;
  // Its frames' period in ns (the owner's bounds count with it); 0: as fast as possible.
  uint64_t period_ns;
  // A frame that has waited this long runs next, whatever its priority; 0: no maximum.
  uint64_t max_wait_ns;
  // Higher runs first, 0 to 255.
  uint32_t priority;
  // Zero.
  uint32_t reserved;
} udma_owner_stream_options;

// A declared stream (`udma_owner_declare`).
typedef struct udma_owner_stream_info {
  // `sizeof(udma_owner_stream_info)`.
  size_t size;
  // Its number, for `udma_owner_submit` and in completions.
  uint32_t stream;
  // Zero.
  uint32_t reserved;
  // The least length of a frame's input buffer.
  uint64_t input_bytes;
  // The least length of a frame's result buffer.
  uint64_t result_bytes;
} udma_owner_stream_info;

// A client's state (`udma_owner_get_info`).
typedef struct udma_owner_info {
  // `sizeof(udma_owner_info)`.
  size_t size;
  // The owner's number for this client.
  uint64_t client;
  // Bytes of its pool (what the owner gave: at most `udma_owner_options.pool_bytes`).
  uint64_t pool_bytes;
  // Frames submitted whose completions were not taken.
  uint32_t in_flight;
  // The most frames it may have in flight (`udma_owner_submit` is busy beyond).
  uint32_t max_in_flight;
  // The most streams it may declare.
  uint32_t max_streams;
  // 1 once the owner has closed the connection (its shutdown, or this client refused), 0
  // before.
  uint32_t gone;
} udma_owner_info;

// A buffer of the client's pool (`udma_owner_alloc`), shared with the owner, who maps it for
// the device.
typedef struct udma_owner_buffer {
  // `sizeof(udma_owner_buffer)`.
  size_t size;
  // The host address of byte 0, valid until `udma_owner_free` or `udma_owner_disconnect`.
  // Write an input before submitting it; read a result after its completion is taken: the
  // device reads and writes it in between.
  void *host;
  // Its length, the `len` asked for.
  size_t len;
  // Its offset in the pool: what `udma_owner_submit` and `udma_owner_free` take.
  uint64_t offset;
} udma_owner_buffer;

// A frame done (`udma_owner_poll`, `udma_owner_wait`).
typedef struct udma_owner_completion {
  // `sizeof(udma_owner_completion)`.
  size_t size;
  // The stream, as submitted.
  uint32_t stream;
  // A `udma_owner_status` (`udma_owner_status_name` names it).
  uint32_t status;
  // The submission's tag.
  uint64_t tag;
  // From the owner taking the frame to its completion, in ns.
  uint64_t latency_ns;
  // From the owner taking the frame to its dispatch to the device, in ns.
  uint64_t wait_ns;
} udma_owner_completion;

// One stream's figures as the owner counts them (`udma_owner_get_stats`).
typedef struct udma_owner_stream_figures {
  // `sizeof(udma_owner_stream_figures)`.
  size_t size;
  // The stream's number.
  uint32_t stream;
  // Zero.
  uint32_t reserved;
  // Frames finished.
  uint64_t frames;
  // Frames the device failed.
  uint64_t failed;
  // Frames lost to device resets.
  uint64_t lost;
  // Latency from the owner taking a frame to its completion, in ns: the median.
  uint64_t latency_p50_ns;
  // Its 99th percentile.
  uint64_t latency_p99_ns;
  // Its maximum.
  uint64_t latency_max_ns;
  // The longest wait as the owner's scheduler bounds count it, in ns.
  uint64_t max_head_wait_ns;
  // The bound on that wait the owner states from the frame times measured so far, in ns
  // (0: none yet).
  uint64_t bound_ns;
  // The longest device time of one of its frames so far, in ns.
  uint64_t frame_ns;
  // The period it declared, in ns (0: as fast as possible).
  uint64_t period_ns;
} udma_owner_stream_figures;

// The owner's totals (`udma_owner_get_stats`).
typedef struct udma_owner_figures {
  // `sizeof(udma_owner_figures)`.
  size_t size;
  // Clients connected.
  uint32_t clients;
  // Streams over all clients.
  uint32_t streams;
  // Frames on the device.
  uint32_t in_flight;
  // Clients that left whose memory is still held for their frames in flight.
  uint32_t departing;
  // Bytes of client pools mapped for the device.
  uint64_t mapped_bytes;
  // Frames completed since the owner started.
  uint64_t frames;
  // Context switches the owner's scheduler caused.
  uint64_t switches;
  // Clients refused at the door.
  uint64_t refused;
  // Clients closed for bad messages or limits.
  uint64_t closed;
  // Clients that hung up with frames out (crashed, killed).
  uint64_t vanished;
  // Clients that hung up with nothing out.
  uint64_t left;
  // Device resets.
  uint64_t resets;
} udma_owner_figures;

// Something the owner told its clients (`udma_owner_next_event`).
typedef struct udma_owner_event {
  // `sizeof(udma_owner_event)`.
  size_t size;
  // A `udma_owner_event_kind`.
  uint32_t kind;
  // Zero.
  uint32_t reserved;
  // `UDMA_OWNER_EVENT_RESET`: the fault's code; otherwise 0.
  uint64_t detail;
} udma_owner_event;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The library's version, `major << 16 | minor << 8 | patch` (as `UDMA_VERSION`). A program
// built against major version M runs with a library of the same M and a minor version at
// least its own.
uint32_t udma_version(void);

// The library's version as text (`"0.1.0"`), a static string.
const char *udma_version_string(void);

// What BAR `index` of the device is: its length. (Accesses need no call before them: the
// reads and writes find the BAR themselves.)
//
// Errors: `UDMA_ERR_NOT_FOUND` for a BAR the device does not have (the loopback device has
// BAR 0, its registers, and BAR 2, its memory); `UDMA_ERR_REMOVED` once the device was
// removed.
//
// # Safety
// `info` points to `info->size` writable bytes (set `info->size = sizeof *info`).
enum udma_status udma_device_get_bar(const struct udma_device *device,
                                     uint32_t index,
                                     struct udma_bar_info *info);

// Reads the 8-bit register at `offset` of BAR `bar` into `*value`: one volatile
// 8-bit load (or one `pread` of it where the kernel serves the BAR through the device
// file). A register with read side effects has them.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
// returns for a device that is gone: check `udma_device_is_removed` when a register reads
// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
//
// # Safety
// `value` points to a writable `uint8_t`.
enum udma_status udma_device_read8(const struct udma_device *device,
                                   uint32_t bar,
                                   uint64_t offset,
                                   uint8_t *value);

// Writes `value` to the 8-bit register at `offset` of BAR `bar`: one volatile 8-bit
// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
// device to read memory the program filled (a doorbell, a DMA start) needs
// `atomic_thread_fence(memory_order_release)` before it.
//
// Errors: as `udma_device_read8`, and `UDMA_ERR_REMOVED` once the device was removed
// (nothing is written).
enum udma_status udma_device_write8(const struct udma_device *device,
                                    uint32_t bar,
                                    uint64_t offset,
                                    uint8_t value);

// Reads the 16-bit register at `offset` of BAR `bar` into `*value`: one volatile
// 16-bit load (or one `pread` of it where the kernel serves the BAR through the device
// file). A register with read side effects has them.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
// returns for a device that is gone: check `udma_device_is_removed` when a register reads
// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
//
// # Safety
// `value` points to a writable `uint16_t`.
enum udma_status udma_device_read16(const struct udma_device *device,
                                    uint32_t bar,
                                    uint64_t offset,
                                    uint16_t *value);

// Writes `value` to the 16-bit register at `offset` of BAR `bar`: one volatile 16-bit
// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
// device to read memory the program filled (a doorbell, a DMA start) needs
// `atomic_thread_fence(memory_order_release)` before it.
//
// Errors: as `udma_device_read16`, and `UDMA_ERR_REMOVED` once the device was removed
// (nothing is written).
enum udma_status udma_device_write16(const struct udma_device *device,
                                     uint32_t bar,
                                     uint64_t offset,
                                     uint16_t value);

// Reads the 32-bit register at `offset` of BAR `bar` into `*value`: one volatile
// 32-bit load (or one `pread` of it where the kernel serves the BAR through the device
// file). A register with read side effects has them.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
// returns for a device that is gone: check `udma_device_is_removed` when a register reads
// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
//
// # Safety
// `value` points to a writable `uint32_t`.
enum udma_status udma_device_read32(const struct udma_device *device,
                                    uint32_t bar,
                                    uint64_t offset,
                                    uint32_t *value);

// Writes `value` to the 32-bit register at `offset` of BAR `bar`: one volatile 32-bit
// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
// device to read memory the program filled (a doorbell, a DMA start) needs
// `atomic_thread_fence(memory_order_release)` before it.
//
// Errors: as `udma_device_read32`, and `UDMA_ERR_REMOVED` once the device was removed
// (nothing is written).
enum udma_status udma_device_write32(const struct udma_device *device,
                                     uint32_t bar,
                                     uint64_t offset,
                                     uint32_t value);

// Reads the 64-bit register at `offset` of BAR `bar` into `*value`: one volatile
// 64-bit load (or one `pread` of it where the kernel serves the BAR through the device
// file). A register with read side effects has them.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
// returns for a device that is gone: check `udma_device_is_removed` when a register reads
// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
//
// # Safety
// `value` points to a writable `uint64_t`.
enum udma_status udma_device_read64(const struct udma_device *device,
                                    uint32_t bar,
                                    uint64_t offset,
                                    uint64_t *value);

// Writes `value` to the 64-bit register at `offset` of BAR `bar`: one volatile 64-bit
// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
// device to read memory the program filled (a doorbell, a DMA start) needs
// `atomic_thread_fence(memory_order_release)` before it.
//
// Errors: as `udma_device_read64`, and `UDMA_ERR_REMOVED` once the device was removed
// (nothing is written).
enum udma_status udma_device_write64(const struct udma_device *device,
                                     uint32_t bar,
                                     uint64_t offset,
                                     uint64_t value);

// Starts a loopback device (`options` may be NULL: the defaults) and returns it in `*device`.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range (the message names it),
// `UDMA_ERR_SYSTEM` if the engine does not start.
//
// # Safety
// `options` is NULL or points to `options->size` readable bytes; `device` points to a
// writable `udma_device *`.
enum udma_status udma_device_open_loopback(const struct udma_loopback_options *options,
                                           struct udma_device **device);

// Opens the PCI function at `bdf` (`"0000:01:00.0"`, or `"01:00.0"` in domain 0) through
// VFIO or UIO (`options` may be NULL: the driver it is bound to, VFIO's defaults, no
// no-IOMMU). The function must be bound to vfio-pci or uio_pci_generic first
// (`userdma bind`).
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a malformed BDF or options; `UDMA_ERR_NOT_FOUND`
// for no such function, or one bound to no driver or another one (the message names the
// `userdma bind` command); `UDMA_ERR_REFUSED` for no-IOMMU mode not allowed, an IOMMU group
// not viable, or permission; `UDMA_ERR_BUSY` for a device (its IOMMU group) another process
// or a VM holds.
//
// # Safety
// `bdf` is a NUL-terminated string; `options` is NULL or points to `options->size` readable
// bytes; `device` points to a writable `udma_device *`.
enum udma_status udma_device_open_pci(const char *bdf,
                                      const struct udma_pci_options *options,
                                      struct udma_device **device);

// Closes a device handle. What was made from it (mappings, pools, queues, buffers) keeps the
// device open until it is destroyed too: each handle holds what it needs, in any order.
//
// Errors: `UDMA_ERR_INVALID_HANDLE` for a handle that is NULL, closed already or not a
// device.
//
// # Safety
// None beyond passing a value that was a `udma_device *` (any value is checked, none is
// dereferenced).
enum udma_status udma_device_close(struct udma_device *device);

// What the device is.
//
// # Safety
// `info` points to `info->size` writable bytes (set `info->size = sizeof *info`).
enum udma_status udma_device_get_info(const struct udma_device *device,
                                      struct udma_device_info *info);

// A new file descriptor for interrupt vector `vector` of the device (an eventfd, readable
// when the vector fires), for the caller's own epoll loop; the caller closes it. A queue's
// own interrupt is `udma_queue_interrupt_fd` (armed by `udma_queue_arm`).
//
// Errors: `UDMA_ERR_NOT_FOUND` for a vector the device does not have.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_device_interrupt_fd(const struct udma_device *device,
                                          uint32_t vector,
                                          int *fd);

// The next event of the device this handle has not seen, waiting up to `timeout_ns`
// nanoseconds (0: just look; `UDMA_TIMEOUT_INFINITE`: until one comes). A removal is reported
// once per handle, before later errors; `event->kind` is `UDMA_EVENT_NONE` when the time ran
// out. No callbacks: call it from the caller's own loop, or poll `udma_device_events_fd`.
//
// # Safety
// `event` points to `event->size` writable bytes (set `event->size = sizeof *event`).
enum udma_status udma_device_next_event(const struct udma_device *device,
                                        uint64_t timeout_ns,
                                        struct udma_event *event);

// A new file descriptor, readable while an event of the device is unread by this handle
// (until `udma_device_next_event` returns it), for the caller's own epoll loop; the caller
// closes it.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_device_events_fd(const struct udma_device *device, int *fd);

// Whether the device was removed, in `*removed` (1 or 0).
//
// # Safety
// `removed` points to a writable `int`.
enum udma_status udma_device_is_removed(const struct udma_device *device, int *removed);

// Takes the loopback device away, as a hot-unplug takes a PCI device (its engine stops, its
// registers read all-ones, the removal is reported): for testing an SDK's removal path
// without hardware.
//
// Errors: `UDMA_ERR_UNSUPPORTED` for a PCI device (unplug it, or `echo 1 >
// /sys/bus/pci/devices/BDF/remove`).
enum udma_status udma_device_remove_loopback(const struct udma_device *device);

// `len` bytes of BAR `bar`'s device memory at the lowest free offset that is a multiple of
// `align` (a power of two; 0 is taken as 1), into `*range`. The loopback device's memory is
// BAR 2.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `len` 0, an alignment that is not a power of
// two, or the loopback device's register BAR 0; `UDMA_ERR_EXHAUSTED` when no free range
// holds it (the message gives the free bytes and the largest free range);
// `UDMA_ERR_NOT_FOUND` for no such BAR; `UDMA_ERR_REMOVED` once the device was removed.
//
// # Safety
// `range` points to `range->size` writable bytes (set `range->size = sizeof *range`).
enum udma_status udma_device_memory_alloc(const struct udma_device *device,
                                          uint32_t bar,
                                          uint64_t len,
                                          uint64_t align,
                                          struct udma_range *range);

// The `len` bytes at `offset` of BAR `bar`'s device memory exactly (a buffer placed by hand),
// into `*range`.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `len` 0, a range that ends past the memory, or one
// that is partly in use; otherwise as `udma_device_memory_alloc`.
//
// # Safety
// `range` points to `range->size` writable bytes (set `range->size = sizeof *range`).
enum udma_status udma_device_memory_alloc_at(const struct udma_device *device,
                                             uint32_t bar,
                                             uint64_t offset,
                                             uint64_t len,
                                             struct udma_range *range);

// Returns a range to the device memory it came from. `*range` must be what
// `udma_device_memory_alloc` or `_alloc_at` filled in, on this device, not freed yet. What a
// descriptor in flight still reads or writes there is the caller's to finish first.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a range freed already, one of another device (or
// never allocated), or one whose BAR, offset or length were changed; nothing is freed then.
//
// # Safety
// `range` points to `range->size` readable bytes.
enum udma_status udma_device_memory_free(const struct udma_device *device,
                                         const struct udma_range *range);

// BAR `bar`'s device memory: its size, the bytes free, the largest free range, and the
// ranges this handle has out.
//
// Errors: `UDMA_ERR_NOT_FOUND` for no such BAR.
//
// # Safety
// `info` points to `info->size` writable bytes (set `info->size = sizeof *info`).
enum udma_status udma_device_memory_get_info(const struct udma_device *device,
                                             uint32_t bar,
                                             struct udma_device_memory_info *info);

// Makes an engine from `ops` and `user`: over `device` (its DMA space holds the pipelines'
// host buffers; keeps it open) or, with `device` NULL, over host memory of its own (for an
// engine that reaches host buffers by their addresses).
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL required function (named), flags that are
// not `UDMA_ENGINE_*`, no queues, or a name that is not UTF-8.
//
// # Safety
// `ops` points to `ops->size` readable bytes; its `name` is NULL or a NUL-terminated string;
// its functions keep the contract the header states; `engine` points to a writable
// `udma_engine *`.
enum udma_status udma_engine_create(const struct udma_device *device,
                                    const struct udma_engine_ops *ops,
                                    void *user,
                                    struct udma_engine **engine);

// Releases the engine handle. Pipelines made on it keep the engine until they are destroyed;
// its `destroy` function is called when the last of them is gone.
//
// # Safety
// `engine` is a handle from `udma_engine_create` (checked).
enum udma_status udma_engine_destroy(struct udma_engine *engine);

// The message of the last failed call on this thread: what failed, on which device, queue,
// buffer or IOVA, and what to do. An empty string if no call on this thread has failed. The
// text stays valid until the next failing call on this thread; copy it to keep it. Successful
// calls leave it as it was.
const char *udma_last_error(void);

// The name of `status` (`"UDMA_ERR_TIMEOUT"`), a static string; `"UDMA_ERR_UNKNOWN"` for a
// value that is not a status.
const char *udma_status_name(int32_t status);

// Maps `bytes` of fresh pinned memory (rounded up to whole pages of `page_size`, a
// `udma_page_size`) into the device's DMA space, on the device's NUMA node when it has one.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 bytes or a bad page size; `UDMA_ERR_EXHAUSTED`
// for too few hugepages (the message says how many to reserve) or IOVA space;
// `UDMA_ERR_REFUSED` for the memory-lock limit.
//
// # Safety
// `mapping` points to a writable `udma_mapping *`.
enum udma_status udma_memory_map(const struct udma_device *device,
                                 uint64_t bytes,
                                 uint32_t page_size,
                                 struct udma_mapping **mapping);

// Maps memory the caller owns, `[addr, addr + bytes)`, into the device's DMA space: any
// range the process mapped writable (anonymous, a shared file, hugetlb), `addr` aligned to
// `page_size` (a `udma_page_size`: the size of the pages behind it) and `bytes` a multiple of
// it. Every page is faulted in now; `udma_mapping_destroy` unmaps it from the device and
// leaves it mapped in the process, with its contents.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL or unaligned `addr`, a length that is not
// whole pages, or a range not all mapped in the process; `UDMA_ERR_REFUSED` for memory that
// cannot be faulted in for writing (read-only, `PROT_NONE`, a device mapping); as
// `udma_memory_map` for the DMA space.
//
// # Safety
// The range stays mapped until `udma_mapping_destroy` of the mapping returned, and is not
// written by the program while a device may write it; `mapping` points to a writable
// `udma_mapping *`.
enum udma_status udma_memory_map_user(const struct udma_device *device,
                                      void *addr,
                                      uint64_t bytes,
                                      uint32_t page_size,
                                      struct udma_mapping **mapping);

// `udma_memory_map_user` with what the device may do with the memory (a `udma_access`).
//
// Errors: as `udma_memory_map_user`; `UDMA_ERR_INVALID_ARGUMENT` for an unknown `access`;
// `UDMA_ERR_UNSUPPORTED` for a mode the device's DMA space cannot enforce (no IOMMU).
//
// # Safety
// As `udma_memory_map_user`.
enum udma_status udma_memory_map_user_access(const struct udma_device *device,
                                             void *addr,
                                             uint64_t bytes,
                                             uint32_t page_size,
                                             uint32_t access,
                                             struct udma_mapping **mapping);

// The mapping's host address, length and IOVA.
//
// # Safety
// `info` points to `info->size` writable bytes.
enum udma_status udma_mapping_get_info(const struct udma_mapping *mapping,
                                       struct udma_mapping_info *info);

// The IOVA of byte `offset` of the mapping, and how many bytes from there are contiguous in
// IOVA space (`contiguous` may be NULL).
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the end.
//
// # Safety
// `iova` points to a writable `uint64_t`; `contiguous` is NULL or does.
enum udma_status udma_mapping_iova(const struct udma_mapping *mapping,
                                   uint64_t offset,
                                   uint64_t *iova,
                                   uint64_t *contiguous);

// Unmaps the memory from the device's DMA space and frees it (memory the caller owns,
// `udma_memory_map_user`, stays mapped in the process). The device must not be using it any
// more (this library submits only pool buffers, which a mapping is not).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_mapping_destroy(struct udma_mapping *mapping);

// A new descriptor (the caller closes it) of the file behind the mapping's memory (the memfd
// of `udma_memory_map`'s memory; an imported dma-buf's own), to pass to another process
// (`udma_share_send`) or to make a dma-buf of (`udma_dmabuf_export_mapping` does that).
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for memory with no file (the caller's own,
// `udma_memory_map_user`); `UDMA_ERR_SYSTEM` when out of descriptors.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_mapping_fd(const struct udma_mapping *mapping, int32_t *fd);

// Makes a pool over `options->bytes` of fresh memory mapped into the device's DMA space.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 bytes, too few for a pool, or a bad page size;
// as `udma_memory_map` otherwise.
//
// # Safety
// `options` points to `options->size` readable bytes; `pool` to a writable `udma_pool *`.
enum udma_status udma_pool_create(const struct udma_device *device,
                                  const struct udma_pool_options *options,
                                  struct udma_pool **pool);

// Destroys a pool. Every buffer of it must be freed first (a buffer in a queue comes back
// with its completion, or with `udma_queue_destroy`). Allocations from the pool in progress
// on other threads are waited for; one that starts meanwhile either finishes first (and
// destroy reports its buffer) or fails with `UDMA_ERR_INVALID_HANDLE`.
//
// Errors: `UDMA_ERR_BUSY` while buffers are out (the message says how many) or another call
// holds the pool (stats, a bulk free, a free into the wrong pool).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_pool_destroy(struct udma_pool *pool);

// Allocates a buffer of `len` bytes (1 to the pool's `max_len`). No system call and no lock
// on the fast path.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a length out of range; `UDMA_ERR_EXHAUSTED` when
// nothing is free (after waiting, with `wait_us`).
//
// # Safety
// `buffer` points to a writable `udma_buffer *`.
enum udma_status udma_pool_alloc(const struct udma_pool *pool,
                                 uint64_t len,
                                 struct udma_buffer **buffer);

// Allocates `count` buffers of `len` bytes each into `buffers[0..count]`: all or nothing
// (on an error no buffer is allocated and `buffers` is untouched).
//
// Errors: as `udma_pool_alloc`; `UDMA_ERR_INVALID_ARGUMENT` for a count above 2^24 (the
// most live buffer handles).
//
// # Safety
// `buffers` points to `count` writable `udma_buffer *`.
enum udma_status udma_pool_alloc_bulk(const struct udma_pool *pool,
                                      uint64_t len,
                                      size_t count,
                                      struct udma_buffer **buffers);

// Frees a buffer back into its pool. The handle is invalid from then on.
//
// Errors: `UDMA_ERR_INVALID_HANDLE` for a buffer freed already (or not a buffer);
// `UDMA_ERR_BUSY` for a buffer in a queue (the device owns it until its completion);
// `UDMA_ERR_INVALID_ARGUMENT` for a buffer of another pool.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_pool_free(const struct udma_pool *pool, struct udma_buffer *buffer);

// Frees `count` buffers: all or nothing (if any one cannot be freed, none is, and the
// message names its index).
//
// Errors: as `udma_pool_free`; `UDMA_ERR_INVALID_ARGUMENT` for a buffer listed twice.
//
// # Safety
// `buffers` points to `count` readable `udma_buffer *`.
enum udma_status udma_pool_free_bulk(const struct udma_pool *pool,
                                     struct udma_buffer *const *buffers,
                                     size_t count);

// A snapshot of the pool's counters.
//
// # Safety
// `stats` points to `stats->size` writable bytes.
enum udma_status udma_pool_get_stats(const struct udma_pool *pool, struct udma_pool_stats *stats);

// The buffer's host address, IOVA, length and state.
//
// # Safety
// `info` points to `info->size` writable bytes.
enum udma_status udma_buffer_get_info(const struct udma_buffer *buffer,
                                      struct udma_buffer_info *info);

// Copies `len` bytes from `src` into the buffer at `offset`.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a range past the buffer's length; `UDMA_ERR_BUSY`
// for a buffer in a queue.
//
// # Safety
// `src` points to `len` readable bytes (or `len` is 0).
enum udma_status udma_buffer_write(const struct udma_buffer *buffer,
                                   uint64_t offset,
                                   const void *src,
                                   size_t len);

// Copies `len` bytes of the buffer at `offset` into `dst`.
//
// Errors: as `udma_buffer_write`.
//
// # Safety
// `dst` points to `len` writable bytes (or `len` is 0).
enum udma_status udma_buffer_read(const struct udma_buffer *buffer,
                                  uint64_t offset,
                                  void *dst,
                                  size_t len);

// A chain of `layers` compute steps over tensors of `bytes` each (rounded up to 4-byte
// words), planned into one arena: the synthetic model of `userdma pipeline`.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 layers or 0 bytes, more than 4096 layers (what
// one ring can carry for a pipeline) or tensors of more than 1 TiB; nothing is allocated
// before these checks.
//
// # Safety
// `model` points to a writable `udma_model *`.
enum udma_status udma_model_create_chain(uint32_t layers,
                                         uint64_t bytes,
                                         struct udma_model **model);

// The YOLOv5s-like model of the zoo: YOLOv5s's tensor graph (640x640x3 input, one byte
// per activation) planned into one arena, each op one layer step, the detections filtered
// on the device so that only a count and at most `max_detections` 32-byte records come back.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `max_detections` 0 or above 25,200 (the records
// the graph's result holds).
//
// # Safety
// `model` points to a writable `udma_model *`.
enum udma_status udma_model_create_yolov5s(uint32_t max_detections, struct udma_model **model);

// The model's sizes.
//
// # Safety
// `info` points to `info->size` writable bytes.
enum udma_status udma_model_get_info(const struct udma_model *model, struct udma_model_info *info);

// The result the device must produce for `input`, computed on the host (as a fresh arena
// would hold it): `result_len` must be at least the model's `result_bytes`, `input_len` at
// least its `input_bytes` (extra input bytes are ignored). Allocates an arena on the host,
// for setting up checks rather than per frame.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL pointer or a length too short;
// `UDMA_ERR_EXHAUSTED` when the host has no room for the model's arena.
//
// # Safety
// `input` points to `input_len` readable bytes, `result` to `result_len` writable ones.
enum udma_status udma_model_expected(const struct udma_model *model,
                                     const void *input,
                                     size_t input_len,
                                     void *result,
                                     size_t result_len);

// Destroys a model handle (pipelines made from it keep their own copy).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_model_destroy(struct udma_model *model);

// Copies `len` bytes from `src` into the frame's input at `offset` (into the slot's DMA
// buffer). Inside a fill or preprocess callback only.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback (kept past it, or
// another thread's), a NULL pointer, or a range past the input's `len`.
//
// # Safety
// `input` is NULL, a view the library passed to a callback (even one that has returned, on
// any thread), or points to a readable `udma_frame_input` (a copy of a view); `src` to `len`
// readable bytes.
enum udma_status udma_frame_input_write(const struct udma_frame_input *input,
                                        uint64_t offset,
                                        const void *src,
                                        size_t len);

// Copies `len` bytes of the frame's result at `offset` into `dst`. Inside a result or
// postprocess callback only.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback (kept past it, or
// another thread's), a failed frame (no result), a NULL pointer, or a range past the
// result's `len`.
//
// # Safety
// `output` is NULL, a view the library passed to a callback (even one that has returned, on
// any thread), or points to a readable `udma_frame_output` (a copy of a view); `dst` to
// `len` writable bytes.
enum udma_status udma_frame_output_read(const struct udma_frame_output *output,
                                        uint64_t offset,
                                        void *dst,
                                        size_t len);

// Makes a pipeline on a loopback device for `model` (`options` may be NULL: the defaults):
// its slots (host buffers from one pool mapped once, one device arena each) and its queues.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range; `UDMA_ERR_UNSUPPORTED`
// for a PCI device (the pipeline runs the loopback device's layer ops); `UDMA_ERR_BUSY`
// for a queue open already; `UDMA_ERR_DEVICE` or `UDMA_ERR_EXHAUSTED` when device memory
// cannot hold `depth` arenas (lower the depth).
//
// # Safety
// `options` is NULL or points to `options->size` readable bytes; `pipeline` to a writable
// `udma_pipeline *`.
enum udma_status udma_pipeline_create(const struct udma_device *device,
                                      const struct udma_model *model,
                                      const struct udma_pipeline_options *options,
                                      struct udma_pipeline **pipeline);

// Makes a pipeline on an engine (`udma_engine_create`) for `model`, as
// `udma_pipeline_create` does on a device. The engine's capabilities decide what runs where:
// steps it cannot run run on the host (between its transfers, in order), and the queues are
// split across units only where it has separate units and orders queues (otherwise one
// queue, as with `UDMA_PIPELINE_ONE_QUEUE`). The engine is polled.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range or one the engine cannot
// carry out (results in place without `UDMA_ENGINE_READ_IN_PLACE`: the message names the
// capability); what the engine's functions return, as their statuses.
//
// # Safety
// As `udma_pipeline_create`.
enum udma_status udma_pipeline_create_on_engine(const struct udma_engine *engine,
                                                const struct udma_model *model,
                                                const struct udma_pipeline_options *options,
                                                struct udma_pipeline **pipeline);

// Submits a frame whose input is `len` bytes copied from `input` (at most the model's
// `input_bytes`; the rest of the slot's input keeps an earlier frame's bytes), and sets
// `*frame` (may be NULL) to its number. Its descriptors are announced once `batch` frames
// are queued (or by `udma_pipeline_flush`, `udma_pipeline_wait`).
//
// Errors: `UDMA_ERR_BUSY` when every slot is in flight (take finished frames first) or
// inside a callback; `UDMA_ERR_INVALID_ARGUMENT` for an input longer than the model's.
//
// # Safety
// `input` points to `len` readable bytes; `frame` is NULL or points to a writable
// `uint64_t`.
enum udma_status udma_pipeline_submit(struct udma_pipeline *pipeline,
                                      const void *input,
                                      size_t len,
                                      uint64_t *frame);

// Submits a frame whose input `fill(user, frame, input)` writes (with
// `udma_frame_input_write`, straight into the slot's DMA buffer), and sets `*frame` (may be
// NULL) to its number. `fill` must return normally (see the callbacks note in the header).
//
// Errors: as `udma_pipeline_submit`; `UDMA_ERR_INVALID_ARGUMENT` for a NULL `fill`.
//
// # Safety
// `fill` is safe to call with `user`; `frame` is NULL or points to a writable `uint64_t`.
enum udma_status udma_pipeline_submit_with(struct udma_pipeline *pipeline,
                                           udma_pipeline_fill_fn fill,
                                           void *user,
                                           uint64_t *frame);

// Announces every queued frame (one doorbell per queue).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_pipeline_flush(struct udma_pipeline *pipeline);

// Hands every finished frame, in frame order, to `result(user, output)` without waiting,
// and sets `*finished` (may be NULL) to how many.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL `result`; `UDMA_ERR_DEVICE` for a broken
// queue. A frame the device failed is no error: it reaches `result` with its status.
//
// # Safety
// `result` is safe to call with `user`; `finished` is NULL or points to a writable `size_t`.
enum udma_status udma_pipeline_poll(struct udma_pipeline *pipeline,
                                    udma_pipeline_result_fn result,
                                    void *user,
                                    size_t *finished);

// Announces queued frames, waits until at least one frame finishes (up to the pipeline's
// `timeout_ns`), and hands it and any others done to `result(user, output)`, in frame
// order; sets `*finished` (may be NULL) to how many (0 when nothing is in flight).
//
// Errors: as `udma_pipeline_poll`; `UDMA_ERR_TIMEOUT` when nothing finishes in time.
//
// # Safety
// As `udma_pipeline_poll`.
enum udma_status udma_pipeline_wait(struct udma_pipeline *pipeline,
                                    udma_pipeline_result_fn result,
                                    void *user,
                                    size_t *finished);

// The pipeline's counters.
//
// # Safety
// `info` points to `info->size` writable bytes.
enum udma_status udma_pipeline_get_info(const struct udma_pipeline *pipeline,
                                        struct udma_pipeline_info *info);

// Drains the frames in flight (their results discarded), gives every buffer back and
// destroys the pipeline. The handle is invalid from then on, even when the drain fails
// (`UDMA_ERR_TIMEOUT`: the device stopped answering; its memory stays with it).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_pipeline_destroy(struct udma_pipeline *pipeline);

// Plans `tensors[0..count]` (each element `tensors[0].size` bytes apart) into one arena.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a malformed list (the message names the tensor: a
// zero size, an interval backwards, an id used twice, a fixed offset misaligned or
// colliding), more than 1,048,576 tensors (checked before anything is allocated), or
// options.
//
// # Safety
// `tensors` points to `count` elements of `tensors[0].size` readable bytes each, and each
// element's `op` is NULL or a NUL-terminated string and its `inputs` NULL or `input_count`
// readable ids; `options` is NULL or points to `options->size` readable bytes; `plan` to a
// writable `udma_plan *`.
enum udma_status udma_plan_create(const struct udma_tensor *tensors,
                                  size_t count,
                                  const struct udma_plan_options *options,
                                  struct udma_plan **plan);

// The arena offset of tensor `id`.
//
// Errors: `UDMA_ERR_NOT_FOUND` for an id the plan does not have.
//
// # Safety
// `offset` points to a writable `uint64_t`.
enum udma_status udma_plan_offset(const struct udma_plan *plan, uint64_t id, uint64_t *offset);

// Every tensor's offset, in the order given to `udma_plan_create`, into
// `offsets[0..count]`; `count` must be the number of tensors.
//
// # Safety
// `offsets` points to `count` writable `uint64_t`.
enum udma_status udma_plan_offsets(const struct udma_plan *plan, uint64_t *offsets, size_t count);

// The plan's figures: arena size, lower bound, naive size, strategy, optimality.
//
// # Safety
// `report` points to `report->size` writable bytes.
enum udma_status udma_plan_get_report(const struct udma_plan *plan,
                                      struct udma_plan_report *report);

// Destroys a plan.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_plan_destroy(struct udma_plan *plan);

// Opens queue `options->index` of the device (`options` may be NULL: queue 0, depth 64, the
// copy engine, interrupts).
//
// Errors: `UDMA_ERR_BUSY` for a queue open already; `UDMA_ERR_NOT_FOUND` for an index past
// the device's queues; `UDMA_ERR_INVALID_ARGUMENT` for a depth that is not a power of two in
// range; `UDMA_ERR_UNSUPPORTED` for a PCI device: its driver brings its own queue format
// (drive its registers with `udma_device_read32` / `udma_device_write32` and the other BAR
// calls, and its DMA with buffers from a pool, as `examples/c/edu_dma.c` does).
//
// # Safety
// `options` is NULL or points to `options->size` readable bytes; `queue` to a writable
// `udma_queue *`.
enum udma_status udma_queue_create(const struct udma_device *device,
                                   const struct udma_queue_options *options,
                                   struct udma_queue **queue);

// Stops the queue and destroys it. Commands still in flight are waited for (up to a second)
// or stopped; their buffers come back to the host under their handles (free them). If the
// device cannot be stopped, their buffers stay with it (leaked on purpose, never freed
// while it may write them), their handles become invalid, and the call returns
// `UDMA_ERR_DEVICE`; the queue handle is destroyed either way. The descriptor
// `udma_queue_interrupt_fd` lent is closed too, if it still names the queue's eventfd (see
// there).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_queue_destroy(struct udma_queue *queue);

// Submits one op and rings the doorbell. Its buffer (if any) moves into the queue.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a bad opcode or argument, a buffer range past its
// end, a buffer of a pool on another device than the queue's (its IOVA would name other
// memory there), or a buffer missing or superfluous; `UDMA_ERR_BUSY` for a buffer in a queue
// already, or whose pool another thread is destroying; `UDMA_ERR_REMOVED` once the device is
// removed; `UDMA_ERR_EXHAUSTED` when the ring is full (take completions first). On an error nothing
// was queued and the buffer stays the caller's.
//
// # Safety
// `op` points to `op->size` readable bytes.
enum udma_status udma_queue_submit(struct udma_queue *queue, const struct udma_op *op);

// Queues one op without ringing the doorbell (`udma_queue_flush` rings it once for a batch).
//
// # Safety
// `op` points to `op->size` readable bytes.
enum udma_status udma_queue_push(struct udma_queue *queue, const struct udma_op *op);

// Rings the doorbell once for everything pushed since the last flush.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_queue_flush(struct udma_queue *queue);

// Takes one completion if there is one, without waiting: `*ready` says whether
// `*completion` was filled. Its buffer is back on the host.
//
// # Safety
// `completion` points to `completion->size` writable bytes; `ready` to a writable `bool`.
enum udma_status udma_queue_poll(struct udma_queue *queue,
                                 struct udma_completion *completion,
                                 bool *ready);

// Waits up to `timeout_ns` nanoseconds (`UDMA_TIMEOUT_INFINITE`: forever) for a completion
// and takes it.
//
// Errors: `UDMA_ERR_TIMEOUT` when the time is up (the message says how many ops are in
// flight).
//
// # Safety
// `completion` points to `completion->size` writable bytes.
enum udma_status udma_queue_wait(struct udma_queue *queue,
                                 uint64_t timeout_ns,
                                 struct udma_completion *completion);

// Sleeps until one of `queues[0..count]` has a completion, or `timeout_ns` passes, and sets
// `*ready` to the index of one that has (take it with `udma_queue_poll`).
//
// Errors: `UDMA_ERR_TIMEOUT` when none has one in time; `UDMA_ERR_INVALID_ARGUMENT` for a
// queue listed twice, `count` 0 or above 4096; `UDMA_ERR_UNSUPPORTED` for a queue made with
// `UDMA_QUEUE_POLL` (no interrupt to sleep on).
//
// # Safety
// `queues` points to `count` readable `udma_queue *`; `ready` to a writable `size_t`.
enum udma_status udma_queue_wait_any(struct udma_queue *const *queues,
                                     size_t count,
                                     uint64_t timeout_ns,
                                     size_t *ready);

// The queue's interrupt, for the caller's own epoll loop: a descriptor of the queue's
// eventfd, readable when the interrupt fires; `udma_queue_arm`, then sleep until the fd is
// readable (unless `arm` said a completion is ready), then `udma_queue_disarm` and
// `udma_queue_poll`.
//
// The descriptor is lent: a duplicate of the eventfd the queue owns (the same counter), the
// same number on every call while it is open, closed by `udma_queue_destroy`. Closing it
// yourself is harmless (the queue keeps working; a later call lends a new number), and
// `udma_queue_destroy` then leaves alone whatever file took the number since: it closes the
// number only if it still names the eventfd it lent (asked of the kernel with `kcmp(2)`;
// where the kernel does not allow `kcmp`, the lent number is left open at destroy, a
// leak of one descriptor, and a later call returns the same number even if closed). Do not
// use it after `udma_queue_destroy`, nor close it while another thread destroys the queue.
//
// Errors: `UDMA_ERR_UNSUPPORTED` for a queue made with `UDMA_QUEUE_POLL`; `UDMA_ERR_SYSTEM`
// when the process has no descriptor to spare.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_queue_interrupt_fd(const struct udma_queue *queue, int *fd);

// Asks the device to raise the queue's interrupt for its next completion (draining stale
// signals first). `*ready` says a completion is there already: do not sleep then.
//
// # Safety
// `ready` points to a writable `bool`.
enum udma_status udma_queue_arm(struct udma_queue *queue, bool *ready);

// Stops the device raising the queue's interrupt (after a wake-up).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_queue_disarm(struct udma_queue *queue);

// The queue's counters.
//
// # Safety
// `info` points to `info->size` writable bytes.
enum udma_status udma_queue_get_info(const struct udma_queue *queue, struct udma_queue_info *info);

// The name of a completion's device status (`"host-unmapped"`), a static string.
const char *udma_op_status_name(uint32_t status);

// Makes streams of `count` pipelines under one scheduler per device (`options` may be
// NULL: round-robin, one frame in flight). On success every pipeline handle in `streams`
// is destroyed: the streams own the pipelines. On a refused argument they stay the
// caller's.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for no streams or more than 64, a NULL, empty or
// duplicate name, a priority above 255, a pipeline listed twice, a bad policy, or
// `batch_k` 0 under `UDMA_POLICY_BATCH`; `UDMA_ERR_INVALID_HANDLE` for a pipeline handle
// that is not live; `UDMA_ERR_BUSY` for a pipeline with frames in flight.
//
// # Safety
// `options` is NULL or points to `options->size` readable bytes; `streams` to `count`
// structs of `streams[0].size` bytes each, their names NUL-terminated strings; `out` to a
// writable `udma_streams *`.
enum udma_status udma_streams_create(const struct udma_streams_options *options,
                                     const struct udma_stream_options *streams,
                                     size_t count,
                                     struct udma_streams **out);

// Runs the streams for `duration_ns`: frames arrive, each device's scheduler picks whose
// frame goes whenever the device can take one, `preprocess(user, stream, frame, input)`
// writes it (may be NULL: the slot's input stays as it was), `postprocess(user, stream,
// output)` gets each result (may be NULL: results are dropped); then the frames in flight
// are drained. `stream` is the index in the array given to `udma_streams_create`. Fills
// `reports[0..count]` (`count` the number of streams; `reports` may be NULL with `count`
// 0) and `*run` (may be NULL). The counts start again at every run. Both callbacks must
// return normally (see the callbacks note in the header).
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a `count` other than 0 or the number of
// streams; `UDMA_ERR_TIMEOUT` or `UDMA_ERR_DEVICE` for a device that stopped answering.
//
// # Safety
// The callbacks are safe to call with `user`; `reports` points to `count` structs of
// `reports[0].size` bytes each; `run` is NULL or points to `run->size` writable bytes.
enum udma_status udma_streams_run(struct udma_streams *streams,
                                  uint64_t duration_ns,
                                  udma_preprocess_fn preprocess,
                                  udma_postprocess_fn postprocess,
                                  void *user,
                                  struct udma_stream_report *reports,
                                  size_t count,
                                  struct udma_run_report *run);

// Drains the streams' pipelines (results discarded), gives their buffers back and destroys
// the streams. The handle is invalid from then on, even when a drain fails.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_streams_destroy(struct udma_streams *streams);

// Makes a dma-buf of `bytes` at `offset` of a mapping's memory (page-aligned; the memory of
// `udma_memory_map`, which lives in a memfd) through `/dev/udmabuf`, and sets `*fd` to it
// (the caller closes it). `flags`: 0, or `UDMA_DMABUF_DMA_ONLY`.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a range not page-aligned or outside the mapping,
// or memory not in a memfd (`udma_memory_map_user`'s); `UDMA_ERR_REFUSED` for memory in huge
// pages without `UDMA_DMABUF_DMA_ONLY` on a kernel that maps them wrongly;
// `UDMA_ERR_UNSUPPORTED` for a kernel without udmabuf.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_dmabuf_export_mapping(const struct udma_mapping *mapping,
                                            uint64_t offset,
                                            uint64_t bytes,
                                            uint32_t flags,
                                            int32_t *fd);

// Makes a dma-buf of a pool buffer's whole block (its capacity) and sets `*fd` to it (the
// caller closes it): for an importer that fills the buffer (V4L2 capture into it). The
// buffer must be on the host, start on a page and hold whole pages (a buffer of a page or
// more from a pool without colouring). `flags` as `udma_dmabuf_export_mapping`'s.
//
// Errors: as `udma_dmabuf_export_mapping`; `UDMA_ERR_BUSY` for a buffer in a queue.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_dmabuf_export_buffer(const struct udma_buffer *buffer,
                                           uint32_t flags,
                                           int32_t *fd);

// Maps another exporter's dma-buf `fd` (the caller keeps `fd`; the library takes its own
// copy) into the device's DMA space for the device to use as `access` (a `udma_access`) says,
// as a mapping (`udma_mapping_get_info` gives its IOVA; its host address is valid where the
// exporter allows a CPU mapping). A dma-buf this library exported maps as its own memory.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an `fd` that is not a dma-buf;
// `UDMA_ERR_UNSUPPORTED` when the kernel cannot pin this dma-buf for this kind of DMA space
// (the message names the kernel feature and release that would).
//
// # Safety
// `mapping` points to a writable `udma_mapping *`.
enum udma_status udma_dmabuf_import(const struct udma_device *device,
                                    int32_t fd,
                                    uint32_t access,
                                    struct udma_mapping **mapping);

// The reverse lookup: if dma-buf `fd` is one this process exported and its memory is still
// mapped, sets `*host` to the host address of its first byte (compare it with
// `udma_buffer_info.host` or a mapping's) and `*len` to its length.
//
// Errors: `UDMA_ERR_NOT_FOUND` for a dma-buf this process did not export (or whose memory is
// gone); `UDMA_ERR_INVALID_ARGUMENT` for an `fd` that is not a dma-buf.
//
// # Safety
// `host` points to a writable `void *`; `len` to a writable `uint64_t`.
enum udma_status udma_dmabuf_origin(int32_t fd, void **host, uint64_t *len);

// A new fence (an eventfd), unsignalled; `*fd` is the caller's to close, poll, or pass to
// another process.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_fence_create(int32_t *fd);

// Signals fence `fd` (an eventfd: one `udma_fence_create` made, or another process's): every
// waiter in every process sees it signalled from now on.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a descriptor that is not open or not an eventfd
// (another driver's `sync_file` signals itself).
//
// # Safety
// None (the descriptor is checked).
enum udma_status udma_fence_signal(int32_t fd);

// Waits until fence `fd` (an eventfd, a `sync_file`, any descriptor that becomes readable)
// is signalled, at most `timeout_ns` nanoseconds (`UINT64_MAX`: no limit; 0: just look).
//
// Errors: `UDMA_ERR_TIMEOUT` when it is not signalled in time; `UDMA_ERR_INVALID_ARGUMENT`
// for a descriptor that is not open.
//
// # Safety
// None (the descriptor is checked).
enum udma_status udma_fence_wait(int32_t fd, uint64_t timeout_ns);

// A fence that signals when frame `frame` of the pipeline is done (handed to postprocessing,
// or lost in a recovery); signalled already for a frame that is. `*fd` is the caller's.
//
// Errors: `UDMA_ERR_BUSY` inside a callback; `UDMA_ERR_SYSTEM` when out of descriptors.
//
// # Safety
// `fd` points to a writable `int`.
enum udma_status udma_pipeline_fence(struct udma_pipeline *pipeline, uint64_t frame, int32_t *fd);

// Sends `count` items (1 to `UDMA_SHARE_MAX_ITEMS`) as one message on Unix socket `socket`
// (a `SOCK_SEQPACKET` or datagram socket keeps messages whole). The message is checked as
// the receiver will check it before it is sent.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a bad count, kind, length or page size, a closed
// descriptor, or a dma-buf item whose descriptor is not a dma-buf of that length; `UDMA_ERR_SYSTEM` when the socket refuses.
//
// # Safety
// `items` points to `count` readable items.
enum udma_status udma_share_send(int32_t socket,
                                 const struct udma_share_item *items,
                                 size_t count);

// Receives one message from Unix socket `socket` into `items` (room for `capacity`) and sets
// `*count`; every received descriptor is the caller's to close. Blocks as the socket does.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a capacity of 0 (nothing is read), a malformed
// message (every descriptor it brought is closed) or one with more items than `capacity`
// (the same); `UDMA_ERR_NOT_FOUND` when the
// peer closed the socket; `UDMA_ERR_SYSTEM` when the socket fails.
//
// # Safety
// `items` points to `capacity` writable items; `count` to a writable `size_t`.
enum udma_status udma_share_recv(int32_t socket,
                                 struct udma_share_item *items,
                                 size_t capacity,
                                 size_t *count);

// Connects to the device owner listening at Unix socket `socket` (a path; `userdma serve`
// prints it) and takes the pool and rings it makes for this client. `options` may be NULL
// (a 16 MiB pool, the program's name, one try). Disconnect with `udma_owner_disconnect`.
//
// Errors: `UDMA_ERR_NOT_FOUND` when no owner listens there (within `wait_ns`);
// `UDMA_ERR_INVALID_ARGUMENT` for a NULL, empty or too long (over 107 bytes) socket path,
// or a name that is not 1 to 32 bytes of UTF-8; `UDMA_ERR_REFUSED` when the owner does not
// allow this process's user or group; `UDMA_ERR_BUSY` when it serves its limit of clients;
// `UDMA_ERR_DEVICE` for a peer that does not speak the owner's protocol;
// `UDMA_ERR_TIMEOUT` for an owner that did not answer.
//
// # Safety
// `socket` is a NUL-terminated string; `options` is NULL or points to `options->size`
// readable bytes with `name` NULL or a NUL-terminated string; `client` points to a writable
// `udma_owner_client *`.
enum udma_status udma_owner_connect(const char *socket,
                                    const struct udma_owner_options *options,
                                    struct udma_owner_client **client);

// Closes the connection and frees every buffer of the client; the handle is invalid from
// then on. Frames still in flight run to their end in the owner (which keeps their memory
// until then); their completions are not delivered. Succeeds also after the owner went away.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_owner_disconnect(struct udma_owner_client *client);

// Declares a stream of frames and fills `*info` with its number and its model's buffer
// sizes.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL, empty, too long (over 32 bytes) or
// non-UTF-8 name or model, a priority above 255, or a name this client's streams have
// already; `UDMA_ERR_NOT_FOUND` for a model the owner does not have (the message lists
// those it has); `UDMA_ERR_EXHAUSTED` at this client's limit of streams, the owner's (64),
// or on a device with no queues left for another; `UDMA_ERR_NOT_FOUND` after the owner went
// away (the message says "the device owner closed the connection").
//
// # Safety
// `stream` points to `stream->size` readable bytes, its `name` and `model` NUL-terminated
// strings; `info` to `info->size` writable bytes.
enum udma_status udma_owner_declare(struct udma_owner_client *client,
                                    const struct udma_owner_stream_options *stream,
                                    struct udma_owner_stream_info *info);

// Closes stream `stream`: its frames in flight complete first (their completions come as
// usual, those not yet run with `UDMA_OWNER_STATUS_CLOSED`), then the owner frees its
// pipeline. Later submissions to it complete with `UDMA_OWNER_STATUS_REFUSED`.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a stream this client did not declare (or closed
// already); the owner's refusal; `UDMA_ERR_NOT_FOUND` after the owner went away.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_owner_close_stream(struct udma_owner_client *client, uint32_t stream);

// The client's state: its number, its pool's bytes, its frames in flight and limits, and
// whether the owner went away.
//
// # Safety
// `info` points to `info->size` writable bytes.
enum udma_status udma_owner_get_info(const struct udma_owner_client *client,
                                     struct udma_owner_info *info);

// Allocates a buffer of `len` bytes from the client's pool, which the owner maps for the
// device, and fills `*buffer`: its host address and its offset, which `udma_owner_submit`
// takes. The buffer is the client's until `udma_owner_free` (or `udma_owner_disconnect`).
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `len` 0 or above the pool's largest block;
// `UDMA_ERR_EXHAUSTED` when the pool has no room (free buffers, or connect with a larger
// `pool_bytes`).
//
// # Safety
// `buffer` points to `buffer->size` writable bytes.
enum udma_status udma_owner_alloc(struct udma_owner_client *client,
                                  size_t len,
                                  struct udma_owner_buffer *buffer);

// Frees the buffer at `offset` (as `udma_owner_alloc` gave it) back into the client's pool.
//
// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset that is no buffer of this client's (freed
// already, or never allocated); `UDMA_ERR_BUSY` for a buffer a frame in flight names (take
// its completion first: the device may still read or write it).
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_owner_free(struct udma_owner_client *client, uint64_t offset);

// Submits a frame of `stream`: the device reads the input at `input_offset` of the client's
// pool and writes the result at `result_offset` (offsets of buffers from `udma_owner_alloc`,
// at least the stream's `input_bytes` and `result_bytes` long). Its completion carries `tag`;
// give each frame in flight its own tag (the library matches a completion to its
// submission by stream and tag to know when its buffers are free). No system call while the
// owner is busy. A stream this client did not declare, an offset that is no buffer of
// `udma_owner_alloc`'s (never allocated, freed, or inside one) or a buffer shorter than the
// stream needs is not an error here: the frame completes with `UDMA_OWNER_STATUS_REFUSED`,
// nothing read or written. The input and the result may be the same buffer.
//
// Errors: `UDMA_ERR_BUSY` when the client has its limit of frames in flight (take
// completions first); `UDMA_ERR_NOT_FOUND` after the owner went away.
//
// # Safety
// None (any value is checked, none is dereferenced).
enum udma_status udma_owner_submit(struct udma_owner_client *client,
                                   uint32_t stream,
                                   uint64_t input_offset,
                                   uint64_t result_offset,
                                   uint64_t tag);

// Takes one completion if there is one, without waiting: `*ready` says whether
// `*completion` was filled. Costs no system call when one is there.
//
// Errors: `UDMA_ERR_NOT_FOUND` once the owner went away and nothing more will complete (the
// message says so; disconnect, and connect again once it is back).
//
// # Safety
// `completion` points to `completion->size` writable bytes; `ready` to a writable `bool`.
enum udma_status udma_owner_poll(struct udma_owner_client *client,
                                 struct udma_owner_completion *completion,
                                 bool *ready);

// Waits up to `timeout_ns` nanoseconds (`UDMA_TIMEOUT_INFINITE`: forever) for a completion
// and takes it. Sleeps only when nothing has completed. Events the owner sends meanwhile
// are kept for `udma_owner_next_event`.
//
// Errors: `UDMA_ERR_TIMEOUT` when the time is up; `UDMA_ERR_NOT_FOUND` when the owner went
// away (the message says "the device owner closed the connection"): frames in flight never
// complete; disconnect, and connect again once it is back.
//
// # Safety
// `completion` points to `completion->size` writable bytes.
enum udma_status udma_owner_wait(struct udma_owner_client *client,
                                 uint64_t timeout_ns,
                                 struct udma_owner_completion *completion);

// Asks the owner for its figures: fills `streams[0..min(count, capacity)]` with this
// client's streams' (`count` being how many it has; `streams` may be NULL with `capacity`
// 0, to learn the count) and `*owner` with the owner's totals (`owner` may be NULL). Sets
// `*count`.
//
// Errors: `UDMA_ERR_NOT_FOUND` after the owner went away; `UDMA_ERR_TIMEOUT` when it did not
// answer.
//
// # Safety
// `streams` is NULL (with `capacity` 0) or points to `capacity` structs of `streams[0].size`
// bytes each; `count` to a writable `size_t`; `owner` is NULL or points to `owner->size`
// writable bytes.
enum udma_status udma_owner_get_stats(struct udma_owner_client *client,
                                      struct udma_owner_stream_figures *streams,
                                      size_t capacity,
                                      size_t *count,
                                      struct udma_owner_figures *owner);

// The oldest event the owner sent that this client has not handed out (a device reset or
// removal, the owner's shutdown), without waiting; `event->kind` is
// `UDMA_OWNER_EVENT_NONE` when there is none. Reads what is waiting on the socket.
//
// Errors: `UDMA_ERR_DEVICE` for a message from the owner this client cannot read.
//
// # Safety
// `event` points to `event->size` writable bytes (set `event->size = sizeof *event`).
enum udma_status udma_owner_next_event(struct udma_owner_client *client,
                                       struct udma_owner_event *event);

// What a completion's `status` means (`"ok"`, `"refused (unknown stream, ...)"`), a static
// string; `"unknown status"` for a value that is not a `udma_owner_status`.
const char *udma_owner_status_name(uint32_t status);

#ifdef __cplusplus
} // extern "C"
#endif // __cplusplus

#endif /* USERDMA_H */
