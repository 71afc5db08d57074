// vnpu/runtime.h — the whole contract of the vNPU runtime ("driver").
//
// A CUDA-runtime-style C++17 API for the virtual NPU. It knows nothing about
// tensors: it owns devices, device memory, streams, events, copies and kernel
// launches (a kernel is a host callable run on the stream's worker thread).
// A hardware port replaces exactly this library; everything above only uses
// this header.
//
// Conventions (mirroring the CUDA runtime):
//  * Every call returns a vnpuError_t and never throws across this boundary.
//  * The current device is per host thread (vnpuSetDevice / vnpuGetDevice),
//    default 0.
//  * A null vnpuStream_t means the default stream of the current device.
//  * Work submitted to a stream runs in submission order on that stream's
//    worker thread; different streams run concurrently.
//  * A kernel that throws records a per-device error naming the kernel. It is
//    returned (once) by the next synchronizing call on that device
//    (vnpuStreamSynchronize, vnpuEventSynchronize, vnpuDeviceSynchronize,
//    vnpuMemcpy) and by vnpuGetLastError; the device stays usable afterwards.
//    vnpuGetLastErrorString() gives the message.
//  * VNPU_LAUNCH_BLOCKING=1 makes every launch and async copy wait for
//    completion and return the kernel's error directly.
//  * Discovery (any first call) only reads the environment; initialization
//    (vnpuInit, or the first call that allocates device memory or queues work)
//    creates the device context. A child fork()ed after initialization cannot
//    use the runtime (vnpuErrorForkedAfterInit); one forked before can.
//
// Environment:
//  VNPU_DEVICE_COUNT        number of physical devices (default 2, max 64)
//  VNPU_VISIBLE_DEVICES     comma-separated physical ids, like CUDA_VISIBLE_DEVICES
//  VNPU_MEMORY_PER_DEVICE   capacity in bytes, suffixes K/M/G/T (KiB...) (default 8G)
//  VNPU_LAUNCH_BLOCKING     1 = synchronous execution (boolean: see vnpuGetEnvFlag)
//  VNPU_IPC                 0 = device memory not exported to other processes (no vnpuIpc*); default 1
//  VNPU_SANITIZE            1 = check every declared access for stream races and use after free
//                           (see "Sanitizer" below); default 0
//  VNPU_SANITIZE_HOST_ACCESS 0 = under VNPU_SANITIZE, leave device memory accessible to host code
//                           (no check 4, see "Sanitizer"); default 1
//
// Example:
//   vnpuStream_t s;  vnpuStreamCreate(&s);
//   void* d;         vnpuMalloc(&d, n);
//   vnpuMemcpyAsync(d, host, n, vnpuMemcpyHostToDevice, s);
//   vnpuLaunchKernel(s, "scale", [=] { scale(static_cast<float*>(d), n / 4); });
//   vnpuMemcpyAsync(host, d, n, vnpuMemcpyDeviceToHost, s);
//   vnpuStreamSynchronize(s);  // returns vnpuErrorLaunchFailure if "scale" threw
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

extern "C++" {

enum vnpuError_t : int {
  vnpuSuccess = 0,
  vnpuErrorInvalidValue = 1,
  vnpuErrorMemoryAllocation = 2,
  vnpuErrorInvalidDevice = 3,
  vnpuErrorNotReady = 4,            // query: work still pending (not a failure)
  vnpuErrorInvalidResourceHandle = 5,
  vnpuErrorLaunchFailure = 6,       // a kernel failed on the device
  vnpuErrorForkedAfterInit = 7,     // runtime used in a child forked after init
  vnpuErrorInvalidConfiguration = 8,  // bad VNPU_* environment variable: no devices
  vnpuErrorMapBufferObjectFailed = 9, // IPC: the exporter's memory could not be mapped
  vnpuErrorNotSupported = 10,         // VMM or IPC without shareable memory (no memfd; IPC: VNPU_IPC=0)
  vnpuErrorInterrupted = 11,          // a host wait was cut short by the wait-interrupt hook
  // Stream capture (CUDA's codes; see "Graphs" below). The message of
  // vnpuGetLastErrorString() says which call and what to do instead.
  vnpuErrorStreamCaptureUnsupported = 12,  // operation not permitted when stream is capturing
  vnpuErrorStreamCaptureInvalidated = 13,  // the capture was invalidated by an earlier error
  vnpuErrorStreamCaptureIsolation = 14,    // dependency on work outside the capture
  vnpuErrorStreamCaptureWrongThread = 15,  // capture ended from another thread (global/thread-local mode)
  vnpuErrorCapturedEvent = 16,             // query/synchronize of an event recorded in a capture
  vnpuErrorIllegalState = 17,              // e.g. begin capture on a stream already capturing
  vnpuErrorStreamRace = 18,           // sanitizer: an access not ordered after a conflicting one (nothing queued)
  vnpuErrorUseAfterFree = 19,         // sanitizer: an access to freed device memory (nothing queued)
  vnpuErrorHostAccess = 20,           // sanitizer: host code accessed device memory directly (nothing queued)
  vnpuErrorStreamCaptureUnjoined = 21,  // a stream that joined a capture was not joined back before its end
};

enum vnpuMemcpyKind : int {
  vnpuMemcpyHostToHost = 0,
  vnpuMemcpyHostToDevice = 1,
  vnpuMemcpyDeviceToHost = 2,
  vnpuMemcpyDeviceToDevice = 3,
};

enum vnpuMemoryType : int {
  vnpuMemoryTypeUnregistered = 0,   // ordinary (pageable) host memory
  vnpuMemoryTypeHost = 1,           // pinned host memory from vnpuMallocHost
  vnpuMemoryTypeDevice = 2,
};

struct vnpuPointerAttributes {
  vnpuMemoryType type;
  int device;        // device of the allocation, -1 for host memory
  void* base;        // start of the allocation containing the pointer
  size_t size;       // bytes of that allocation
};

struct vnpuDeviceProp {
  char name[64];
  size_t totalGlobalMem;      // bytes
  int multiProcessorCount;    // worker cores the device may use
  int major, minor;           // compute capability of the virtual ISA
};

using vnpuStream_t = struct vnpuStream_st*;
using vnpuEvent_t = struct vnpuEvent_st*;
using vnpuGraph_t = struct vnpuGraph_st*;
using vnpuGraphExec_t = struct vnpuGraphExec_st*;
using vnpuKernel_t = std::function<void()>;  // may throw; see error rules above

// Event flags (CUDA's values).
constexpr unsigned vnpuEventDefault = 0x0;
constexpr unsigned vnpuEventDisableTiming = 0x2;

const char* vnpuGetErrorString(vnpuError_t error);
// Returns and clears the last asynchronous error of the current device.
vnpuError_t vnpuGetLastError();
vnpuError_t vnpuPeekAtLastError();
// The pending asynchronous error of `device` (any device, not cleared). For a
// kernel that reads another device's memory: its failed producer's error.
vnpuError_t vnpuDevicePeekError(int device);
// Message of the last error reported by this thread (e.g. the failing kernel).
const char* vnpuGetLastErrorString();

// Devices. vnpuGetDeviceCount reports 0 devices rather than failing.
// Fails with vnpuErrorInvalidConfiguration (count = 0) when VNPU_DEVICE_COUNT or
// VNPU_MEMORY_PER_DEVICE cannot be parsed or the memory cannot be reserved;
// vnpuGetConfigurationErrorString() then says which and why.
vnpuError_t vnpuGetDeviceCount(int* count);
const char* vnpuGetConfigurationErrorString();  // "" when the configuration is valid
// VNPU_* values that were not understood and were ignored ("" if none), one
// message per line, for the layer above to show as warnings.
const char* vnpuGetConfigurationWarningString();
// Boolean environment variables, one rule for every VNPU_* flag (PyTorch's own,
// c10::utils::check_env): "1" = on, "0" = off, unset = `default_value`. Any other
// value ("true", "yes", " 1", "2", "") is not understood: *value = default_value
// and the call returns vnpuErrorInvalidValue, so the caller can warn.
vnpuError_t vnpuGetEnvFlag(const char* name, int default_value, int* value);
// Initializes the runtime (like cuInit; flags must be 0). Idempotent. Calls
// that allocate device memory or queue work initialize it on their own.
vnpuError_t vnpuInit(unsigned flags);
// 1 once the runtime was initialized in this process (0 in a bad fork).
int vnpuIsInitialized();
vnpuError_t vnpuSetDevice(int device);
vnpuError_t vnpuGetDevice(int* device);
vnpuError_t vnpuGetDeviceProperties(vnpuDeviceProp* prop, int device);
vnpuError_t vnpuDeviceSynchronize();
// Waits until all work queued on `device` (any stream) has run, like
// vnpuDeviceSynchronize, but leaves a pending kernel error for the next
// synchronizing call (returns vnpuSuccess, or vnpuErrorInterrupted). A
// capturing stream is not waited for. For host-side state changes that
// queued work must not observe (Note [Host modes take effect as of the call]).
vnpuError_t vnpuDeviceWaitIdle(int device);
// Share of the last second (percent, rounded) during which at least one of the device's streams ran a kernel,
// copy or memset: NVML's utilization.gpu, behind torch.vnpu.utilization / memory_usage.
vnpuError_t vnpuDeviceGetUtilization(int device, unsigned* percent);
// 1 if any runtime call was made in this process before a fork() into it.
int vnpuIsInBadFork();

// Device memory: 4096-byte aligned, one contiguous range of the device's memory.
vnpuError_t vnpuMalloc(void** ptr, size_t size);
// Like cudaFree: waits for all work on the owning device first (never cut
// short by the wait-interrupt hook). Returns a kernel error that was pending on
// that device, but frees the block all the same.
vnpuError_t vnpuFree(void* ptr);
vnpuError_t vnpuMemGetInfo(size_t* free_bytes, size_t* total_bytes);
// Pinned host memory.
vnpuError_t vnpuMallocHost(void** ptr, size_t size);
vnpuError_t vnpuFreeHost(void* ptr);
vnpuError_t vnpuPointerGetAttributes(vnpuPointerAttributes* attr, const void* ptr);
// The device whose memory holds ptr (device memory, VMM-mapped or IPC-mapped),
// or -1 for any other pointer, without vnpuPointerGetAttributes' allocation
// lookup (cuPointerGetAttribute's CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): what a
// deleter needs per free.
vnpuError_t vnpuPointerGetDevice(int* device, const void* ptr);

// Streams. Priorities: lower number = higher priority, range [-1, 0].
vnpuError_t vnpuDeviceGetStreamPriorityRange(int* least, int* greatest);
vnpuError_t vnpuStreamCreate(vnpuStream_t* stream);
vnpuError_t vnpuStreamCreateWithPriority(vnpuStream_t* stream, unsigned flags, int priority);
vnpuError_t vnpuStreamDestroy(vnpuStream_t stream);
vnpuError_t vnpuStreamGetPriority(vnpuStream_t stream, int* priority);
vnpuError_t vnpuStreamGetDevice(vnpuStream_t stream, int* device);
// The device of `stream` if it is a live stream of this process (made by vnpuStreamCreate*, or a default
// stream); vnpuErrorInvalidResourceHandle for anything else (destroyed, null, not a stream). For handles
// that come from outside (torch.vnpu.ExternalStream); other calls trust their stream argument, as CUDA's.
vnpuError_t vnpuStreamCheckHandle(vnpuStream_t stream, int* device);
vnpuError_t vnpuStreamSynchronize(vnpuStream_t stream);
vnpuError_t vnpuStreamQuery(vnpuStream_t stream);   // vnpuSuccess or vnpuErrorNotReady
vnpuError_t vnpuStreamWaitEvent(vnpuStream_t stream, vnpuEvent_t event, unsigned flags = 0);
// Handle of the default stream of `device` (never destroyed).
vnpuError_t vnpuGetDefaultStream(int device, vnpuStream_t* stream);

// Kernels: `name` appears in error messages ("kernel 'aten::index_select' failed ...").
vnpuError_t vnpuLaunchKernel(vnpuStream_t stream, const char* name, vnpuKernel_t kernel);
using vnpuHostFn_t = void (*)(void* user_data);
vnpuError_t vnpuLaunchHostFunc(vnpuStream_t stream, vnpuHostFn_t fn, void* user_data);
// Interrupting host waits (no CUDA equivalent; Ctrl-C support for the layer
// above). While a host thread blocks in vnpuStreamSynchronize,
// vnpuEventSynchronize, vnpuDeviceSynchronize, vnpuMemcpy, vnpuMemcpyAsync into
// pageable memory or a launch under VNPU_LAUNCH_BLOCKING, `fn` runs on that
// thread every `slice_us` microseconds (no runtime lock held); a nonzero result
// ends the wait with vnpuErrorInterrupted. The work waited for keeps running
// on its stream and a pending kernel error stays pending; an unfinished copy
// into pageable memory is abandoned (it will not write the destination).
// vnpuFree, vnpuStreamDestroy and vnpuMemUnmap always wait to the end.
// nullptr disables it. Process-wide.
vnpuError_t vnpuSetWaitInterruptHook(int (*fn)(), unsigned slice_us);
// Blocking-wait hooks (no CUDA equivalent: kernels run on host threads, and a
// kernel of the layer above may need a lock that the waiting thread holds,
// e.g. Python's GIL for a kernel written in Python). `enter` runs on a host
// thread about to block in one of the interruptible waits listed above, with
// no runtime lock held; `leave` gets its result when that wait ends, also with
// no runtime lock held. nullptr disables them. Process-wide.
vnpuError_t vnpuSetBlockingWaitHooks(void* (*enter)(), void (*leave)(void*));
// Worker idle hook (no CUDA equivalent: workers are host threads): `fn` runs on
// a stream's worker thread once its queue has stayed empty for `linger_us`
// microseconds after running work, so the layer above can release per-thread
// resources that compete with other threads while idle (the OpenMP pool of
// ATen's kernels). nullptr disables it. Process-wide; applies to every stream.
vnpuError_t vnpuSetWorkerIdleHook(void (*fn)(), unsigned linger_us);

// Virtual memory management (the CUDA driver's cuMemAddressReserve,
// cuMemCreate, cuMemMap, ...). Physical memory comes in handles that take whole
// pages of a device's capacity from anywhere, contiguous or not, and are mapped
// into address ranges reserved beforehand: a large range can be built from
// scattered free memory (the caching allocator's expandable segments). Sizes,
// offsets and addresses are multiples of the granularity (2 MiB). Mapped
// memory is device memory for every other call (copies, vnpuPointerGetAttributes).
// Example:
//   vnpuMemAllocationProp prop{/*device=*/0};
//   size_t g;  vnpuMemGetAllocationGranularity(&g, &prop, vnpuMemAllocationGranularityMinimum);
//   void* va;  vnpuMemAddressReserve(&va, 64 * g, 0, nullptr, 0);
//   vnpuMemGenericAllocationHandle_t h;  vnpuMemCreate(&h, 4 * g, &prop, 0);
//   vnpuMemMap(va, 4 * g, 0, h, 0);  vnpuMemRelease(h);  // pages live while mapped
//   ... use [va, va + 4g) ...
//   vnpuMemUnmap(va, 4 * g);  vnpuMemAddressFree(va, 64 * g);
using vnpuMemGenericAllocationHandle_t = struct vnpuMemHandle_st*;
struct vnpuMemAllocationProp {
  int device;  // where the physical memory lives
};
enum vnpuMemAllocationGranularityFlags : int {
  vnpuMemAllocationGranularityMinimum = 0,
  vnpuMemAllocationGranularityRecommended = 1,
};
vnpuError_t vnpuMemGetAllocationGranularity(size_t* granularity, const vnpuMemAllocationProp* prop,
                                            vnpuMemAllocationGranularityFlags option);
// Reserves address space only (no memory). `addr` (a hint) is ignored; flags must be 0.
vnpuError_t vnpuMemAddressReserve(void** ptr, size_t size, size_t alignment, void* addr,
                                  unsigned long long flags);
// Frees a whole reservation; it must not be mapped any more.
vnpuError_t vnpuMemAddressFree(void* ptr, size_t size);
// Takes `size` bytes of the device's free memory (vnpuErrorMemoryAllocation if
// less is free in total; vnpuErrorNotSupported if the device's memory is not a
// shareable memfd). Counts in vnpuMemGetInfo like vnpuMalloc.
vnpuError_t vnpuMemCreate(vnpuMemGenericAllocationHandle_t* handle, size_t size,
                          const vnpuMemAllocationProp* prop, unsigned long long flags);
// Drops the handle; its memory returns to the device once it is not mapped anywhere.
vnpuError_t vnpuMemRelease(vnpuMemGenericAllocationHandle_t handle);
// Maps bytes [offset, offset + size) of `handle` at `ptr`, inside a reservation
// and over no other mapping.
vnpuError_t vnpuMemMap(void* ptr, size_t size, size_t offset, vnpuMemGenericAllocationHandle_t handle,
                       unsigned long long flags);
// Unmaps [ptr, ptr + size), which must be exactly one or more whole mappings;
// first waits for the work queued on their devices (no error is consumed).
vnpuError_t vnpuMemUnmap(void* ptr, size_t size);

// Inter-process memory (CUDA IPC). Device memory is a shared mapping (a memfd)
// that other processes of this host and user can map:
// vnpuIpcGetMemHandle exports the device range holding devPtr (any address in
// a device's linear memory; an address in a vnpuMemMap mapping gives
// vnpuErrorInvalidValue); vnpuIpcOpenMemHandle, in another process, maps that
// whole range (once per exporter device; later opens share the mapping) and
// returns the local address of devPtr. Unlike CUDA (one allocation), every
// address A of the exporter's device memory, including allocations made after
// the open, is then at *devPtr + (A - exported devPtr). Opening a handle of the
// calling process returns devPtr itself. vnpuIpcCloseMemHandle drops one open;
// the last one unmaps. Errors: vnpuErrorMapBufferObjectFailed (exporter gone,
// or no permission to open /proc/<pid>/fd), vnpuErrorNotSupported (VNPU_IPC=0).
struct vnpuIpcMemHandle_t {
  char reserved[64];
};
constexpr unsigned vnpuIpcMemLazyEnablePeerAccess = 0x1;  // CUDA's flag; accepted, no effect
vnpuError_t vnpuIpcGetMemHandle(vnpuIpcMemHandle_t* handle, void* devPtr);
vnpuError_t vnpuIpcOpenMemHandle(void** devPtr, vnpuIpcMemHandle_t handle, unsigned flags);
vnpuError_t vnpuIpcCloseMemHandle(void* devPtr);

// Events (CUDA semantics: a never-recorded event is complete; a wait or
// synchronize refers to the record current at its call, even if the event is
// re-recorded meanwhile; vnpuEventDestroy returns at once and the event is
// released when queued work that uses it has run).
vnpuError_t vnpuEventCreate(vnpuEvent_t* event);
vnpuError_t vnpuEventCreateWithFlags(vnpuEvent_t* event, unsigned flags);
vnpuError_t vnpuEventDestroy(vnpuEvent_t event);
vnpuError_t vnpuEventRecord(vnpuEvent_t event, vnpuStream_t stream);
vnpuError_t vnpuEventQuery(vnpuEvent_t event);      // vnpuSuccess or vnpuErrorNotReady
vnpuError_t vnpuEventSynchronize(vnpuEvent_t event);
// Milliseconds between two completed events recorded with timing enabled.
vnpuError_t vnpuEventElapsedTime(float* ms, vnpuEvent_t start, vnpuEvent_t end);

// Copies. Async copies are stream-ordered. A host source that is not pinned is
// staged at call time (the caller may reuse it at once); a pageable host
// destination makes the call wait for completion (as CUDA does).
vnpuError_t vnpuMemcpyAsync(void* dst, const void* src, size_t count, vnpuMemcpyKind kind,
                            vnpuStream_t stream);
vnpuError_t vnpuMemcpy(void* dst, const void* src, size_t count, vnpuMemcpyKind kind);
// vnpuMemcpyAsync(dst, src.get(), count, vnpuMemcpyHostToDevice, stream) from
// pageable host memory the caller hands over: the task holds `src` until the
// copy has run, so the runtime stages nothing (the caller already made a
// private copy, e.g. converted the dtype on the host). A capturing stream
// records it (the buffer is the node's).
vnpuError_t vnpuMemcpyAsyncFromHostBuffer(void* dst, std::shared_ptr<const void> src, size_t count,
                                          vnpuStream_t stream);
vnpuError_t vnpuMemsetAsync(void* dst, int value, size_t count, vnpuStream_t stream);
// Reads `count` bytes of the open file `fd` from byte `offset` straight into device memory `dst`, as a copy
// task on `stream`: storage to device with no host staging buffer (the role of cuFileReadAsync, GPUDirect
// Storage). The runtime reads from its own duplicate of `fd`, so the caller may close it at once. When the
// task has run, *bytes_read holds the bytes read (fewer than `count` if the file ended first) or -errno after a
// failed read (it holds -1 before); the task never fails the stream. Read it after synchronizing with the task
// (an event recorded after it). Out of descriptors for the duplicate, nothing is queued and *bytes_read is
// -EMFILE at once. vnpuErrorInvalidValue if `fd` is not open; vnpuErrorStreamCaptureUnsupported on a capturing
// stream.
vnpuError_t vnpuMemcpyFromFileAsync(void* dst, int fd, uint64_t offset, size_t count,
                                    std::shared_ptr<int64_t> bytes_read, vnpuStream_t stream);
// Writes `count` bytes of device memory `src` to the open file `fd` at byte `offset` (pwrite), as a copy task
// on `stream`: device to storage with no host staging buffer (the role of cuFileWriteAsync). The bytes written
// are those `src` holds when the task runs, after the work queued on `stream` before it. The runtime writes
// through its own duplicate of `fd`. When the task has run, *bytes_written holds `count` or -errno after a
// failed write (ENOSPC, EBADF, ...; it holds -1 before; -EMFILE at once, nothing queued, when no descriptor is
// left for the duplicate); the task never fails the stream. A pending error of
// the device (a failed kernel) is the stream's, as for any copy. vnpuErrorStreamCaptureUnsupported on a
// capturing stream.
vnpuError_t vnpuMemcpyToFileAsync(int fd, uint64_t offset, const void* src, size_t count,
                                  std::shared_ptr<int64_t> bytes_written, vnpuStream_t stream);

// Graphs: stream capture and replay (cudaStreamBeginCapture, cudaGraphLaunch).
// While a stream is capturing, the work submitted to it (kernels, device
// copies, memsets, graph launches; from any thread) is recorded into a graph
// instead of being queued. vnpuGraphLaunch later queues the whole recorded
// sequence as ONE task on any stream of the device: the nodes run in capture
// order on that stream's worker, with the arguments they were captured with
// (the same device addresses: change the inputs' contents, not their
// addresses). A node that throws ends the launch and becomes the device's
// sticky error, naming the node.
// What a capture refuses (vnpuErrorStreamCaptureUnsupported, and the capture is
// invalidated: vnpuStreamEndCapture then fails with
// vnpuErrorStreamCaptureInvalidated and the message of the first refusal):
//  * waiting on the capturing stream: vnpuStreamSynchronize/Query of it,
//    vnpuDeviceSynchronize of its device, copies into or out of pageable host
//    memory on it (the host waits, or the source would be read at capture time);
//  * vnpuEventQuery/Synchronize of an event recorded in the capture
//    (vnpuErrorCapturedEvent), a wait of a capturing stream on an event recorded
//    outside its capture or in another capture (vnpuErrorStreamCaptureIsolation);
//  * "unsafe" calls (vnpuMalloc, vnpuFree, vnpuMallocHost, vnpuFreeHost, the
//    vnpuMem* VMM calls) from any thread while a capture of mode Global is
//    underway, or from the capturing thread in mode ThreadLocal, unless the
//    calling thread's mode is Relaxed (vnpuThreadExchangeStreamCaptureMode).
// Cross-stream capture (fork/join), as CUDA: a stream that waits on an event
// recorded in a capture joins it (its work is recorded into the same graph)
// until the capture ends; the capturing stream must wait on an event recorded
// on each joined stream after its last task before vnpuStreamEndCapture, else
// that fails with vnpuErrorStreamCaptureUnjoined and no graph. A replay runs
// the recorded tasks of all joined streams in recording order.
// Under VNPU_LAUNCH_BLOCKING=1 a capture still records (nothing runs, nothing
// is waited for); vnpuGraphLaunch waits for the whole graph.
// Example:
//   vnpuStreamBeginCapture(s, vnpuStreamCaptureModeGlobal);
//   vnpuLaunchKernel(s, "scale", [=] { scale(d, n); });  // recorded, not run
//   vnpuGraph_t g;      vnpuStreamEndCapture(s, &g);
//   vnpuGraphExec_t x;  vnpuGraphInstantiate(&x, g, 0);
//   for (int i = 0; i < 10; ++i) vnpuGraphLaunch(x, s);  // 10 tasks, not 10 x nodes
enum vnpuStreamCaptureMode : int {
  vnpuStreamCaptureModeGlobal = 0,
  vnpuStreamCaptureModeThreadLocal = 1,
  vnpuStreamCaptureModeRelaxed = 2,
};
enum vnpuStreamCaptureStatus : int {
  vnpuStreamCaptureStatusNone = 0,
  vnpuStreamCaptureStatusActive = 1,
  vnpuStreamCaptureStatusInvalidated = 2,
};
vnpuError_t vnpuStreamBeginCapture(vnpuStream_t stream, vnpuStreamCaptureMode mode);
// Ends the capture (from the thread that began it, unless its mode is
// Relaxed). *graph is null if the capture was invalidated.
vnpuError_t vnpuStreamEndCapture(vnpuStream_t stream, vnpuGraph_t* graph);
vnpuError_t vnpuStreamIsCapturing(vnpuStream_t stream, vnpuStreamCaptureStatus* status);
// Status and a process-unique id of the capture (0 when not capturing).
vnpuError_t vnpuStreamGetCaptureInfo(vnpuStream_t stream, vnpuStreamCaptureStatus* status,
                                     unsigned long long* id);
// Swaps the calling thread's capture interaction mode (default Global) with *mode.
vnpuError_t vnpuThreadExchangeStreamCaptureMode(vnpuStreamCaptureMode* mode);
vnpuError_t vnpuGraphGetNodeCount(vnpuGraph_t graph, size_t* count);
// Writes the graph as Graphviz dot (one node per recorded task, in order).
vnpuError_t vnpuGraphDebugDotPrint(vnpuGraph_t graph, const char* path);
vnpuError_t vnpuGraphDestroy(vnpuGraph_t graph);
// flags must be 0. The executable graph is independent of `graph` afterwards.
vnpuError_t vnpuGraphInstantiate(vnpuGraphExec_t* exec, vnpuGraph_t graph, unsigned long long flags);
// Queues the graph's nodes as one task on `stream` (of the graph's device).
vnpuError_t vnpuGraphLaunch(vnpuGraphExec_t exec, vnpuStream_t stream);
// May be called while a launch is queued: the launch keeps what it needs.
vnpuError_t vnpuGraphExecDestroy(vnpuGraphExec_t exec);

// Activity records (a reduced CUPTI activity API, for profilers). While
// recording is on, every task a stream runs leaves one record when it ends;
// when off, a launch costs one relaxed atomic load more. Times are
// steady-clock nanoseconds (std::chrono::steady_clock, the clock of
// vnpuActivityGetTimestamp). The correlation id is the top of the launching
// host thread's stack at submission (CUPTI's external correlation id: the
// layer above pushes the id of the operator it runs), 0 if the stack is empty.
enum vnpuActivityKind : int {
  vnpuActivityKindKernel = 0,   // vnpuLaunchKernel / vnpuLaunchHostFunc
  vnpuActivityKindMemcpy = 1,   // vnpuMemcpy[Async]
  vnpuActivityKindMemset = 2,   // vnpuMemsetAsync
  vnpuActivityKindSync = 3,     // vnpuEventRecord / vnpuStreamWaitEvent tasks
};
struct vnpuActivityRecord {
  vnpuActivityKind kind;
  std::string name;             // kernel name as launched; "memcpy HtoD", "memset", "event wait", ...
  int device;
  vnpuStream_t stream;          // the stream that ran the task (never null)
  int64_t queued_ns;            // when the host submitted the task
  int64_t start_ns, end_ns;     // when the stream's worker ran it
  size_t bytes;                 // memcpy / memset size, 0 otherwise
  vnpuMemcpyKind copy_kind;     // memcpy only
  int host_pinned;              // memcpy: the host side is pinned memory (vnpuMallocHost)
  int src_device, dst_device;   // memcpy: device of the source / destination, -1 for host memory
  uint64_t correlation_id;      // external correlation id, 0 = none
  uint64_t host_thread;         // system id (Linux tid) of the submitting host thread
  int failed;                   // the task threw (its error is the device's sticky error)
};
// Turns recording on (1) or off (0). Turning it on drops records nobody
// flushed. Tasks submitted while on are recorded even if they run after off.
vnpuError_t vnpuActivityEnable(int enable);
int vnpuActivityIsEnabled();
// Per host thread: the id at the top applies to tasks this thread submits.
vnpuError_t vnpuActivityPushExternalCorrelationId(uint64_t id);
// vnpuErrorInvalidValue if the stack is empty; `id` may be null.
vnpuError_t vnpuActivityPopExternalCorrelationId(uint64_t* id);
// Moves the records of tasks that have ended into *records (appended, in the
// order the tasks ended).
vnpuError_t vnpuActivityFlushAll(std::vector<vnpuActivityRecord>* records);
// Waits until every task submitted while recording was on, on every stream
// of every device, has ended and left its record (tasks submitted after
// recording was turned off are not waited for), so that a flush afterwards
// holds them all. timeout_ms < 0: no limit. vnpuErrorNotReady when some still
// run at the timeout; vnpuErrorInterrupted when the wait-interrupt hook ended
// the wait (Ctrl-C). Consumes no device error.
vnpuError_t vnpuActivitySynchronize(int64_t timeout_ms);
// The record clock now, in nanoseconds.
vnpuError_t vnpuActivityGetTimestamp(int64_t* ns);

// Sanitizer (VNPU_SANITIZE=1 or vnpuSanitizerEnable; no CUDA equivalent, the
// idea of compute-sanitizer's racecheck applied to streams). The runtime keeps,
// per byte range of memory, the last task that wrote it and the tasks that
// read it since, as (stream, position in that stream), and a vector clock per
// stream: what each stream's next task is ordered after. Clocks follow
// happens-before as CUDA defines it, not timing: same-stream order, event
// record -> vnpuStreamWaitEvent, and host waits (stream/event/device
// synchronize, a query that answers complete, blocking copies): work a host
// thread queues after such a wait is ordered after what it waited for. A
// launch declares its accesses; one that reads a range whose last write is not
// ordered before it, or writes a range read or written by an unordered task,
// is refused (vnpuErrorStreamRace, nothing queued) and
// vnpuSanitizerGetLastReport describes the conflict. Copies and memsets
// declare their device ranges themselves. Freed memory (vnpuSanitizerFree) is
// poisoned on its stream; an access to it before vnpuSanitizerAlloc hands it
// out again is refused with vnpuErrorUseAfterFree. Off: every call costs one
// relaxed atomic load more.
struct vnpuMemAccess {
  const void* ptr;
  size_t bytes;
  int write;         // 0 = read
  // Optional, a strided view: only the bytes at offsets o from ptr with
  // o % row_stride < row_bytes are accessed (row_bytes < row_stride); 0:
  // every byte. Overlap between row sets of one stride is exact.
  size_t row_bytes = 0;
  size_t row_stride = 0;
};
struct vnpuSanitizerReport {
  vnpuError_t error = vnpuSuccess;  // vnpuErrorStreamRace or vnpuErrorUseAfterFree
  size_t access = 0;                // index of the refused access in the call's list
  int write = 0;                    // the refused access writes
  const void* ptr = nullptr;        // the refused access's range (it overlaps the earlier one)
  size_t bytes = 0;
  vnpuStream_t stream = nullptr;    // stream of the refused task (null: the host)
  uint64_t position = 0;            // its position in that stream (1 = first task)
  std::string name;                 // its name
  vnpuStream_t other_stream = nullptr;  // the earlier, unordered access's stream (null: the host)
  uint64_t other_position = 0;
  std::string other_name;
  int other_write = 0;
  int freed_since = 0;              // the range was freed (and handed out again) after the earlier access
                                    // (HostAccess: allocated again after the host access)
  vnpuStream_t freed_on = nullptr;  // UseAfterFree: the stream whose free poisoned it
  // A race found outside a launching call, reported by a later call
  // (`stream`/`name`): 1 = at a free (vnpuSanitizerFree): `ptr`/`bytes` the
  // freed block, `freed_on` its stream, `other_*` the unordered access of
  // another stream; 2 = host code rewrote pinned memory a queued upload reads
  // (vnpuMemcpyAsync): `ptr`/`bytes` the upload's source, `host_offset` the
  // first byte that changed, `other_*` the upload.
  int deferred = 0;
  size_t host_offset = 0;
  vnpuStream_t recorded_on = nullptr;  // deferred 1 from vnpuSanitizerFreeRecorded: a stream it was recorded on
  // HostAccess: `ptr` is the first address host code touched since the last
  // report, `write` whether it wrote; `stream`/`name` the call that reports it.
  uint64_t host_thread = 0;         // Linux tid of the thread that touched it
  char host_thread_name[16] = {};   // that thread's name (pthread_setname_np)
  size_t host_pages = 0;            // 4096-byte pages host code touched since the last report (>= 1)
};
// Turns checking on for this process. vnpuErrorNotSupported once the runtime
// is initialized without it (earlier work was not tracked). Idempotent.
vnpuError_t vnpuSanitizerEnable();
int vnpuSanitizerIsEnabled();
// vnpuLaunchKernel with declared accesses (checked and recorded when the
// sanitizer is on; identical to vnpuLaunchKernel when off).
vnpuError_t vnpuLaunchKernelWithAccesses(vnpuStream_t stream, const char* name, vnpuKernel_t kernel,
                                         const vnpuMemAccess* accesses, size_t count);
// Accesses made by host code (a synchronous kernel run on the calling thread).
vnpuError_t vnpuSanitizerHostAccess(const char* name, const vnpuMemAccess* accesses, size_t count);
// The report of this thread's last refused call.
vnpuError_t vnpuSanitizerGetLastReport(vnpuSanitizerReport* report);
// The allocator above frees [ptr, ptr+bytes) allocated on `stream`: queues a
// poison fill (0xFF bytes: NaN in every floating dtype) on `stream` and marks
// the range freed. No-op when off. The free counts as a write by `stream`: if
// another stream accessed the range without being ordered before this point
// (a tensor used on a side stream and dropped without record_stream), the free
// is done all the same, its poison fill waits for that stream's work queued so
// far, and it returns vnpuErrorStreamRace: the report (deferred = 1) is
// returned by the next call that reports host accesses (vnpuLaunchKernel*,
// copies, memsets, synchronizes, vnpuSanitizerCheckHostAccess), on any thread.
vnpuError_t vnpuSanitizerFree(void* ptr, size_t bytes, vnpuStream_t stream);
// Which allocation the device memory at `ptr` belongs to (or last belonged to): a number that
// vnpuSanitizerAlloc increases per allocation; 0 when off or unknown.
uint64_t vnpuSanitizerAllocationEpoch(const void* ptr);
// The allocator frees [ptr, ptr+bytes) allocated on `stream` and recorded on
// the `count` streams `uses` (record_stream): it calls vnpuSanitizerFree only
// when they have passed this point. This checks the free now, as
// vnpuSanitizerFree does, with the recorded streams counted as ordered: a
// stream that used the range and is neither recorded nor ordered before the
// free gives vnpuErrorStreamRace, reported as vnpuSanitizerFree's. Marks and
// poisons nothing. No-op when off.
vnpuError_t vnpuSanitizerFreeRecorded(void* ptr, size_t bytes, vnpuStream_t stream, const vnpuStream_t* uses,
                                      size_t count);
// ... hands [ptr, ptr+bytes) out again (the access history is kept: a task of
// another stream still unordered with the old use is a race for the new one).
vnpuError_t vnpuSanitizerAlloc(void* ptr, size_t bytes);

// Host access to device memory (check 4; Linux memory protection keys). With
// the sanitizer on, device memory (the linear range, vnpuMemMap mappings) is
// tagged with a protection key that host threads have no access to: only
// stream workers (and threads they start, e.g. OpenMP helpers) and threads
// between vnpuSanitizerDeviceAccessBegin/End may touch it. A host thread that
// reads or writes it faults; the runtime's SIGSEGV handler (chained to the
// previous one for every other fault) records the address, the thread and
// whether it wrote, lets that access complete (the page stays accessible
// until the report) and the next vnpuLaunchKernel[WithAccesses],
// vnpuMemcpy[Async], vnpuMemsetAsync, vnpuSanitizerHostAccess, stream/event/
// device synchronize or vnpuSanitizerCheckHostAccess on any thread returns
// vnpuErrorHostAccess once (nothing queued; a synchronize has waited), with
// vnpuSanitizerGetLastReport describing it. A hardware port, whose device
// memory is not host-addressable, never reports it and may implement
// Begin/End as no-ops. Uses pkeys (x86 PKU, Linux >= 4.9); without them (or
// with VNPU_SANITIZE_HOST_ACCESS=mprotect) page protection, which misses host
// accesses to memory a kernel touched since the host last synchronized.
// VNPU_SANITIZE_HOST_ACCESS=0 turns check 4 off; the other checks stay on.
// 0 if check 4 is off, 1 with protection keys, 2 with page protection;
// *reason (may be null) is "" (kept for compatibility).
int vnpuSanitizerHostAccessCheckEnabled(const char** reason);
// The calling thread does device work on the host (a synchronous kernel, a
// transport thread): it may touch device memory until the matching End.
// Nestable; threads it creates meanwhile inherit the access. No-op when off.
vnpuError_t vnpuSanitizerDeviceAccessBegin();
vnpuError_t vnpuSanitizerDeviceAccessEnd();
// Device memory is about to be read or written by the OS on behalf of a
// thread that has access (a socket transport's send/recv): with page
// protection such accesses cannot fault and get EFAULT, so device memory is
// opened and not protected again until the last matching End (check 4 misses
// host accesses meanwhile). No-op with keys (the thread's rights apply) or off.
vnpuError_t vnpuSanitizerSystemAccessBegin();
vnpuError_t vnpuSanitizerSystemAccessEnd();
// vnpuErrorHostAccess (and the report) if host code touched device memory
// since the last report, else vnpuSuccess.
vnpuError_t vnpuSanitizerCheckHostAccess();

}  // extern "C++"
