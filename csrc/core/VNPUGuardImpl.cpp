#include "VNPUGuardImpl.h"

#include "VNPUCachingAllocator.h"
#include "VNPUException.h"
#include "VNPUFunctions.h"
#include "VNPUStream.h"

namespace c10::vnpu::impl {

Device VNPUGuardImpl::exchangeDevice(Device d) const {
  TORCH_INTERNAL_ASSERT(d.type() == static_type);
  return Device(static_type, ExchangeDevice(d.index()));
}

Device VNPUGuardImpl::getDevice() const { return Device(static_type, current_device()); }

void VNPUGuardImpl::setDevice(Device d) const {
  TORCH_INTERNAL_ASSERT(d.type() == static_type);
  set_device(d.index());
}

void VNPUGuardImpl::uncheckedSetDevice(Device d) const noexcept { vnpuSetDevice(d.index()); }

Stream VNPUGuardImpl::getStream(Device d) const { return getCurrentVNPUStream(d.index()).unwrap(); }

Stream VNPUGuardImpl::getDefaultStream(Device d) const {
  return getDefaultVNPUStream(d.index()).unwrap();
}

// Note [Callbacks run on the caller's stream]
// c10's Future (its only user in torch) runs then() callbacks on the stream
// returned here, ordered only after the future's events. CUDA hands out a pool
// stream; a callback then races whatever the caller queued before then() and
// uses tensors allocated on the caller's stream without recording them there.
// PowerSGD's DDP hook does both (it all-reduces P, written on the caller's
// stream after its first collective was issued, and subtracts a clone freed
// on that stream); CUDA's version survives on timing and a
// torch.cuda.synchronize() in the hook, on vnpu's workers it trained on
// half-written or reused memory. vnpu returns the caller's current stream:
// a callback's kernels are ordered after everything queued before then(), in
// the allocator's order. The price: the caller's stream waits for the
// collective there (less overlap of a comm hook with the backward pass).
Stream VNPUGuardImpl::getStreamFromGlobalPool(Device d, bool /*is_high_priority*/) const {
  return getCurrentVNPUStream(d.index()).unwrap();
}

// As CUDAGuardImpl: "new" streams come from the fixed pool, so creating
// streams in a loop (torch.Stream(device="vnpu")) never leaks workers.
Stream VNPUGuardImpl::getNewStream(Device d, int priority) const {
  return getStreamFromPool(priority, d.index()).unwrap();
}

Stream VNPUGuardImpl::exchangeStream(Stream s) const {
  VNPUStream stream(s);
  VNPUStream prev = getCurrentVNPUStream(s.device_index());
  setCurrentVNPUStream(stream);
  return prev.unwrap();
}

DeviceIndex VNPUGuardImpl::deviceCount() const noexcept { return device_count(); }

void VNPUGuardImpl::destroyEvent(void* event, const DeviceIndex) const noexcept {
  if (event != nullptr) vnpuEventDestroy(static_cast<vnpuEvent_t>(event));
}

void VNPUGuardImpl::record(void** event, const Stream& stream, const DeviceIndex device_index,
                           const EventFlag flag) const {
  TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
              "Event device index ", int(device_index), " does not match recording stream's device index ",
              int(stream.device_index()), ".");
  if (*event == nullptr) {
    // PYTORCH_DEFAULT disables timing, as CUDA's guard does.
    unsigned flags = flag == EventFlag::BACKEND_DEFAULT ? vnpuEventDefault : vnpuEventDisableTiming;
    vnpuEvent_t e = nullptr;
    VNPU_CHECK(vnpuEventCreateWithFlags(&e, flags));
    *event = e;
  }
  VNPU_CHECK(vnpuEventRecord(static_cast<vnpuEvent_t>(*event), VNPUStream(stream).stream()));
}

void VNPUGuardImpl::block(void* event, const Stream& stream) const {
  if (event == nullptr) return;
  VNPU_CHECK(vnpuStreamWaitEvent(VNPUStream(stream).stream(), static_cast<vnpuEvent_t>(event), 0));
}

bool VNPUGuardImpl::queryEvent(void* event) const {
  if (event == nullptr) return true;
  const vnpuError_t r = vnpuEventQuery(static_cast<vnpuEvent_t>(event));
  if (r == vnpuErrorNotReady) return false;
  VNPU_CHECK(r);
  raisePendingError();
  return true;
}

void VNPUGuardImpl::synchronizeEvent(void* event) const {
  if (event == nullptr) return;
  VNPU_CHECK(vnpuEventSynchronize(static_cast<vnpuEvent_t>(event)));
}

double VNPUGuardImpl::elapsedTime(void* start, void* end, const DeviceIndex) const {
  TORCH_CHECK(start != nullptr && end != nullptr,
              "Both events must be recorded before calculating elapsed time.");
  float ms = 0;
  vnpuError_t err = vnpuEventElapsedTime(&ms, static_cast<vnpuEvent_t>(start),
                                         static_cast<vnpuEvent_t>(end));
  TORCH_CHECK(err != vnpuErrorInvalidResourceHandle,
              "Both events must be created with enable_timing=True and recorded before "
              "calculating elapsed time.");
  TORCH_CHECK(err != vnpuErrorNotReady,
              "Both events must be completed before calculating elapsed time; call "
              "synchronize() on the end event first.");
  VNPU_CHECK(err);
  return ms;
}

bool VNPUGuardImpl::queryStream(const Stream& stream) const { return VNPUStream(stream).query(); }

// torch.Stream.is_capturing() and torch.accelerator's capture checks (e.g. torch.optim's) ask here.
bool VNPUGuardImpl::isStreamCapturing(const Stream& stream) const {
  vnpuStreamCaptureStatus status = vnpuStreamCaptureStatusNone;
  VNPU_CHECK(vnpuStreamIsCapturing(VNPUStream(stream).stream(), &status));
  return status != vnpuStreamCaptureStatusNone;
}

void VNPUGuardImpl::synchronizeStream(const Stream& stream) const {
  VNPUStream(stream).synchronize();
}

void VNPUGuardImpl::synchronizeDevice(const DeviceIndex device_index) const {
  device_synchronize(device_index);
}

void VNPUGuardImpl::recordDataPtrOnStream(const DataPtr& data_ptr, const Stream& stream) const {
  allocator::recordStream(data_ptr, VNPUStream(stream));
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, VNPUGuardImpl);

}  // namespace c10::vnpu::impl
