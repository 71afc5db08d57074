#include "VNPUHooks.h"

#include "VNPUException.h"
#include "VNPUFunctions.h"
#include "VNPUGeneratorImpl.h"
#include "VNPUHostAllocator.h"
#include "../ops/Factory.h"

namespace at::vnpu {

bool VNPUHooks::isAvailable() const { return c10::vnpu::device_count() > 0; }

void VNPUHooks::init() const {
  TORCH_CHECK(!c10::vnpu::is_in_bad_fork(),
              "Cannot re-initialize vNPU in forked subprocess. To use vNPU with multiprocessing, you must use "
              "the 'spawn' start method");
  VNPU_CHECK(vnpuInit(0));  // as CUDAHooks::init creates the context
}

bool VNPUHooks::hasPrimaryContext(DeviceIndex device_index) const {
  return device_index >= 0 && device_index < c10::vnpu::device_count();
}

DeviceIndex VNPUHooks::deviceCount() const { return c10::vnpu::device_count(); }
void VNPUHooks::setCurrentDevice(DeviceIndex device) const { c10::vnpu::set_device(device); }
DeviceIndex VNPUHooks::getCurrentDevice() const { return c10::vnpu::current_device(); }
DeviceIndex VNPUHooks::exchangeDevice(DeviceIndex device) const { return c10::vnpu::ExchangeDevice(device); }
DeviceIndex VNPUHooks::maybeExchangeDevice(DeviceIndex device) const { return c10::vnpu::ExchangeDevice(device); }

const Generator& VNPUHooks::getDefaultGenerator(DeviceIndex device_index) const {
  return getDefaultVNPUGenerator(device_index);
}

Generator VNPUHooks::getNewGenerator(DeviceIndex device_index) const { return createVNPUGenerator(device_index); }

Device VNPUHooks::getDeviceFromPtr(void* data) const {
  vnpuPointerAttributes attr{};
  VNPU_CHECK(vnpuPointerGetAttributes(&attr, data));
  TORCH_CHECK(attr.type == vnpuMemoryTypeDevice, "pointer ", data, " is not vnpu device memory");
  return Device(DeviceType::PrivateUse1, static_cast<DeviceIndex>(attr.device));
}

bool VNPUHooks::isPinnedPtr(const void* data) const { return at::vnpu::isPinnedPtr(data); }

Allocator* VNPUHooks::getPinnedMemoryAllocator() const { return getVNPUHostAllocator(); }

void VNPUHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_storage_bytes(storage, newsize, /*exact=*/true);
}

void register_hooks() {
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(new VNPUHooks());  // lives for the process
    return true;
  }();
  (void)done;
}

}  // namespace at::vnpu
