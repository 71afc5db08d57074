// PrivateUse1HooksInterface for vnpu (mirrors at::cuda::detail::CUDAHooks):
// generators, pinned memory queries, device-from-pointer, storage resize.
#pragma once

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace at::vnpu {

struct VNPUHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override;
  void init() const override;
  bool hasPrimaryContext(DeviceIndex device_index) const override;
  DeviceIndex deviceCount() const override;
  void setCurrentDevice(DeviceIndex device) const override;
  DeviceIndex getCurrentDevice() const override;
  DeviceIndex exchangeDevice(DeviceIndex device) const override;
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override;
  const Generator& getDefaultGenerator(DeviceIndex device_index) const override;
  Generator getNewGenerator(DeviceIndex device_index = -1) const override;
  Device getDeviceFromPtr(void* data) const override;
  bool isPinnedPtr(const void* data) const override;
  Allocator* getPinnedMemoryAllocator() const override;
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

// Registers the hooks with ATen (idempotent).
void register_hooks();

}  // namespace at::vnpu
