#include "Copy.h"

#include "CpuAlias.h"
#include "Executor.h"
#include "WorkerWarnings.h"
#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"
#include "../core/VNPUStream.h"
#include "../sanitizer/Sanitizer.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace at::vnpu {
namespace {

using c10::vnpu::check_sync;
using c10::vnpu::getCurrentVNPUStream;

// True when a byte copy of the storage span is the whole element copy.
bool same_dense_layout(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes().equals(b.sizes()) && a.strides().equals(b.strides()) &&
         a.is_non_overlapping_and_dense() && b.is_non_overlapping_and_dense() && !a.is_conj() &&
         !b.is_conj() && !a.is_neg() && !b.is_neg();
}

size_t span_bytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

void record_pinned(const Tensor& cpu, const c10::vnpu::VNPUStream& stream) {
  at::getHostAllocator(DeviceType::PrivateUse1)
      ->record_event(cpu.data_ptr(), cpu.storage().data_ptr().get_context(), stream.unwrap());
}

// A runtime copy whose sanitizer report names the device tensors (shape, dtype,
// allocation site), as an op's launch does. `dev_src` / `dev_dst`: the device
// sides, declared in the runtime's order (source, then destination). Other
// errors, and the invalid-value answer for memory the runtime does not know,
// are returned.
vnpuError_t memcpy_named(void* to, const void* from, size_t n, vnpuMemcpyKind kind, vnpuStream_t stream,
                         const Tensor* dev_src, const Tensor* dev_dst) {
  const vnpuError_t e = vnpuMemcpyAsync(to, from, n, kind, stream);
  if ((e == vnpuErrorStreamRace || e == vnpuErrorUseAfterFree) && sanitizer::enabled()) {
    sanitizer::Accesses acc;
    auto add = [&acc](const Tensor& t, bool write, const char* what) {
      acc.add(t.storage().data(), t.storage().nbytes(), t.sizes(), t.strides(), t.storage_offset(),
              t.scalar_type(), t.device().index(), write, what);
    };
    if (dev_src != nullptr) add(*dev_src, false, "the copy's source");
    if (dev_dst != nullptr) add(*dev_dst, true, "the copy's destination");
    sanitizer::raise(e, nullptr, &acc);
  }
  return e;
}

// As CUDA's copy_: a copy between tensors of one dtype and one dense layout
// is a memcpy (DtoD, or PtoP between two devices); any other (converting the
// dtype, strided, conj/neg) is a kernel, named `aten::copy_`.
void device_to_device(Tensor& dst, const Tensor& src) {
  DeviceIndex dd = dst.device().index(), sd = src.device().index();
  c10::DeviceGuard guard(dst.device());
  auto dst_stream = getCurrentVNPUStream(dd);
  const bool memcpy = same_dense_layout(dst, src);
  std::function<void()> kernel = [ds = spec_of(dst), ss = spec_of(src), sd, dd] {
    if (sd != dd && vnpuDevicePeekError(sd) != vnpuSuccess) {  // Note [Errors follow peer copies] (runtime)
      throw std::runtime_error("its source, on vnpu:" + std::to_string(sd) + ", was produced by a failed kernel (" +
                               vnpuGetLastErrorString() + "); the copy was not made");
    }
    AliasContext ctx;
    ctx.make(ds).copy_(ctx.make(ss));
  };
  sanitizer::Accesses acc;
  if (sanitizer::enabled()) {
    acc.add(dst.storage().data(), dst.storage().nbytes(), dst.sizes(), dst.strides(), dst.storage_offset(),
            dst.scalar_type(), dd, /*write=*/true, "argument 'self' (the destination)");
    acc.add(src.storage().data(), src.storage().nbytes(), src.sizes(), src.strides(), src.storage_offset(),
            src.scalar_type(), sd, /*write=*/false, "argument 'src'");
  }
  auto run = [&] {
    if (memcpy) {
      const vnpuError_t e = memcpy_named(dst.data_ptr(), src.const_data_ptr(), span_bytes(dst),
                                         vnpuMemcpyDeviceToDevice, dst_stream.stream(), &src, &dst);
      // vnpuErrorInvalidValue: memory the runtime does not know as device memory; the kernel copies it.
      if (e != vnpuErrorInvalidValue) {
        VNPU_CHECK(e);
        return;
      }
    }
    launch("aten::copy_", dd, std::move(kernel), &acc);
  };
  if (dd == sd) {
    run();
    return;
  }
  // Peer copy: dst's stream waits for src's stream, and src's stream waits
  // for the copy before reusing src's memory (as CUDA's copy kernel does).
  auto src_stream = getCurrentVNPUStream(sd);
  vnpuEvent_t before = nullptr, after = nullptr;
  VNPU_CHECK(vnpuEventCreateWithFlags(&before, vnpuEventDisableTiming));
  VNPU_CHECK(vnpuEventCreateWithFlags(&after, vnpuEventDisableTiming));
  VNPU_CHECK(vnpuEventRecord(before, src_stream.stream()));
  VNPU_CHECK(vnpuStreamWaitEvent(dst_stream.stream(), before, 0));
  run();
  VNPU_CHECK(vnpuEventRecord(after, dst_stream.stream()));
  VNPU_CHECK(vnpuStreamWaitEvent(src_stream.stream(), after, 0));
  // Queued records and waits hold their own references to the events.
  VNPU_CHECK(vnpuLaunchKernel(src_stream.stream(), "event release", [before, after] {
    vnpuEventDestroy(before);
    vnpuEventDestroy(after);
  }));
}

// A blocking copy with pinned memory waits for it; if that wait is interrupted (Ctrl-C: Note
// [Interrupting host waits]) the copy is still queued, so the pinned block stays out of the host
// allocator's cache until it has run, as for a non_blocking copy.
void synchronize_or_record(const Tensor& pinned, const c10::vnpu::VNPUStream& stream) {
  try {
    VNPU_CHECK(vnpuStreamSynchronize(stream.stream()));  // reported once, by copy_
  } catch (...) {
    record_pinned(pinned, stream);
    throw;
  }
}

void host_to_device_queued(Tensor& dst, const Tensor& src, bool non_blocking,
                           const c10::vnpu::VNPUStream& stream);

// Note [Blocking uploads synchronize]
// A blocking copy to the device returns once the copy has run, as CUDA's copy_ does (it synchronizes the
// stream): work the program then queues on any stream, or host code, sees the uploaded data. Returning with
// the copy still queued behind earlier work let a side stream read the tensor before it was written (CUDA-
// correct code gave wrong numbers, 2 of 5 runs, found by a break test).
void host_to_device(Tensor& dst, const Tensor& src, bool non_blocking) {
  c10::DeviceGuard guard(dst.device());
  auto stream = getCurrentVNPUStream(dst.device().index());
  host_to_device_queued(dst, src, non_blocking, stream);
  // (a pinned same-layout copy was waited for already: idle now)
  if (!non_blocking) VNPU_CHECK(vnpuStreamSynchronize(stream.stream()));
}

void host_to_device_queued(Tensor& dst, const Tensor& src, bool non_blocking,
                           const c10::vnpu::VNPUStream& stream) {
  if (!src.is_pinned()) {
    // A pageable source would be read now, not at each replay: the runtime refuses such a copy on a
    // capturing stream (and invalidates the capture, as CUDA). The staged paths below never ask the
    // runtime, so a capturing stream gets the runtime's refusal first.
    vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
    VNPU_CHECK(vnpuStreamIsCapturing(stream.stream(), &status));
    if (status != vnpuStreamCaptureStatusNone) {
      const char byte = 0;
      VNPU_CHECK(vnpuMemcpyAsync(dst.data_ptr(), &byte, 1, vnpuMemcpyHostToDevice, stream.stream()));
    }
  }
  if (same_dense_layout(dst, src)) {
    VNPU_CHECK(memcpy_named(dst.data_ptr(), src.const_data_ptr(), span_bytes(dst), vnpuMemcpyHostToDevice,
                            stream.stream(), nullptr, &dst));
    // The runtime copies from pinned memory asynchronously. A blocking copy returns with the source free
    // to reuse or modify (as CUDA's copy_, which synchronizes the stream); a non_blocking one keeps the
    // pinned block out of the host allocator's cache until the copy has run.
    if (src.is_pinned()) {
      if (non_blocking) record_pinned(src, stream);
      else synchronize_or_record(src, stream);
    }
    return;
  }
  // Convert on the host into dst's dtype (and dst's layout when it is dense).
  const bool dense = dst.is_non_overlapping_and_dense();
  Tensor staged = dense ? at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(kCPU))
                        : at::empty(dst.sizes(), dst.options().device(kCPU));
  staged.copy_(src);
  // `staged` is ours: the task keeps it alive, so the runtime stages nothing more. A memcpy in the
  // trace, as CUDA's memcpy of its host-side temporary.
  auto staged_copy = [&stream](void* to, const Tensor& from, size_t n) {
    std::shared_ptr<const void> buf(from.const_data_ptr(), [keep = from](const void*) {});
    VNPU_CHECK(vnpuMemcpyAsyncFromHostBuffer(to, std::move(buf), n, stream.stream()));
  };
  if (dense && !dst.is_conj() && !dst.is_neg()) {
    staged_copy(dst.data_ptr(), staged, span_bytes(dst));
    return;
  }
  Tensor tmp = at::empty(dst.sizes(), dst.options());
  staged_copy(tmp.data_ptr(), staged, span_bytes(tmp));
  device_to_device(dst, tmp);
}

void device_to_host(Tensor& dst, const Tensor& src, bool non_blocking) {
  c10::DeviceGuard guard(src.device());
  auto stream = getCurrentVNPUStream(src.device().index());
  if (same_dense_layout(dst, src)) {
    VNPU_CHECK(memcpy_named(dst.data_ptr(), src.const_data_ptr(), span_bytes(dst), vnpuMemcpyDeviceToHost,
                            stream.stream(), &src, nullptr));
    if (dst.is_pinned()) {
      if (non_blocking) record_pinned(dst, stream);
      else synchronize_or_record(dst, stream);
    }
    return;
  }
  // Gather into a dense device buffer of dst's dtype, then one memcpy.
  Tensor tmp = at::empty(dst.sizes(), src.options().dtype(dst.scalar_type()));
  Tensor tmp_dst = tmp;
  device_to_device(tmp_dst, src);
  Tensor host = at::empty(dst.sizes(), dst.options().device(kCPU).pinned_memory(false));
  VNPU_CHECK(memcpy_named(host.data_ptr(), tmp.const_data_ptr(), span_bytes(tmp), vnpuMemcpyDeviceToHost,
                          stream.stream(), &tmp, nullptr));
  dst.copy_(host);
}

}  // namespace

Tensor& copy_(Tensor& dst, const Tensor& src, bool non_blocking) {
  TORCH_CHECK(dst.defined() && src.defined(), "copy_: both tensors must be defined");
  if (dst.numel() == 0) return dst;
  const bool dst_dev = dst.device().type() == DeviceType::PrivateUse1;
  const bool src_dev = src.device().type() == DeviceType::PrivateUse1;
  TORCH_CHECK(dst_dev || dst.is_cpu(), "copy_ from vnpu to ", dst.device(), " is not supported; copy to cpu first");
  TORCH_CHECK(src_dev || src.is_cpu(), "copy_ from ", src.device(), " to vnpu is not supported; copy to cpu first");
  if (dst.is_same(src)) return dst;
  if (dst_dev) {
    // CPU's overlap errors, at the call (metadata only: no device memory is read).
    at::assert_no_internal_overlap(dst);
    if (src_dev) at::assert_no_partial_overlap(dst, src);
  }
  // As CUDA's memcpy_and_sync: a blocking copy to or from the host waits for the stream.
  if (dst_dev != src_dev && !non_blocking)
    check_sync(dst_dev ? "a blocking copy to vnpu (torch.tensor(..., device=), .to(), copy_)"
                       : "a blocking copy to the host (.cpu(), .tolist(), .numpy(), printing, .to())");
  Tensor s = src.expand_as(dst);  // broadcasting rules and errors of copy_
  materialize_for_write(dst);     // Note [Copy-on-write storages]
  if (dst_dev && src_dev) device_to_device(dst, s);
  else if (dst_dev) host_to_device(dst, s, non_blocking);
  else device_to_host(dst, s, non_blocking);
  flush_worker_warnings();  // Note [Worker warnings]
  return dst;
}

Scalar local_scalar_dense(const Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  check_sync("aten::_local_scalar_dense (.item(), bool(t), int(t), float(t))");
  Tensor host = at::empty({}, self.options().device(kCPU));
  c10::DeviceGuard guard(self.device());
  auto stream = getCurrentVNPUStream(self.device().index());
  Tensor one = self.reshape({});
  if (one.is_conj() || one.is_neg()) one = one.resolve_conj().resolve_neg();
  VNPU_CHECK(memcpy_named(host.data_ptr(), one.const_data_ptr(), self.element_size(), vnpuMemcpyDeviceToHost,
                          stream.stream(), &one, nullptr));
  flush_worker_warnings();
  return at::_local_scalar_dense(host);
}

}  // namespace at::vnpu

#include <torch/library.h>

namespace at::vnpu {
namespace {

Tensor& copy_kernel(Tensor& self, const Tensor& src, bool non_blocking) { return copy_(self, src, non_blocking); }

Tensor copy_from(const Tensor& self, const Tensor& dst, bool non_blocking) {
  Tensor d = dst;
  copy_(d, self, non_blocking);
  return dst;
}

Tensor copy_from_and_resize(const Tensor& self, const Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) dst.resize_(self.sizes());
  Tensor d = dst;
  copy_(d, self, false);
  return dst;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("copy_", TORCH_FN(copy_kernel));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
}

}  // namespace at::vnpu
