// DeviceGuardImplInterface for vnpu (mirrors c10/cuda/impl/CUDAGuardImpl.h):
// lets DeviceGuard, StreamGuard, torch.Stream/torch.Event and autograd's
// stream handling work on vnpu. Events are created lazily at first record.
#pragma once

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace c10::vnpu::impl {

struct VNPUGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr DeviceType static_type = DeviceType::PrivateUse1;

  DeviceType type() const override { return static_type; }
  Device exchangeDevice(Device d) const override;
  Device getDevice() const override;
  void setDevice(Device d) const override;
  void uncheckedSetDevice(Device d) const noexcept override;
  Stream getStream(Device d) const override;
  Stream getDefaultStream(Device d) const override;
  Stream getStreamFromGlobalPool(Device d, bool is_high_priority = false) const override;
  Stream getNewStream(Device d, int priority = 0) const override;
  Stream exchangeStream(Stream s) const override;
  DeviceIndex deviceCount() const noexcept override;

  void destroyEvent(void* event, const DeviceIndex device_index) const noexcept override;
  void record(void** event, const Stream& stream, const DeviceIndex device_index,
              const EventFlag flag) const override;
  void block(void* event, const Stream& stream) const override;
  bool queryEvent(void* event) const override;
  void synchronizeEvent(void* event) const override;
  double elapsedTime(void* start, void* end, const DeviceIndex device_index) const override;

  bool queryStream(const Stream& stream) const override;
  bool isStreamCapturing(const Stream& stream) const override;
  void synchronizeStream(const Stream& stream) const override;
  void synchronizeDevice(const DeviceIndex device_index) const override;
  void recordDataPtrOnStream(const DataPtr& data_ptr, const Stream& stream) const override;
};

}  // namespace c10::vnpu::impl
