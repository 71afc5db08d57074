// Device management functions of the PyTorch layer (mirrors c10/cuda/CUDAFunctions.h).
// Snake_case functions throw c10::Error; device_count() never throws.
#pragma once

#include <c10/core/Device.h>

namespace c10::vnpu {

// Number of visible vNPU devices (VNPU_DEVICE_COUNT / VNPU_VISIBLE_DEVICES); 0 on failure.
DeviceIndex device_count() noexcept;
DeviceIndex current_device();
// Throws if `device` is not in [0, device_count()).
void set_device(DeviceIndex device);
// Sets `device` and returns the previous one.
DeviceIndex ExchangeDevice(DeviceIndex device);
// Waits for all work on `device` (-1: current); raises pending kernel errors.
void device_synchronize(DeviceIndex device = -1);
// Throws the CUDA-style "invalid device ordinal" error for bad indices.
void check_device_index(DeviceIndex device);
// True in a child forked after the runtime was initialized (then vnpu must not be used).
bool is_in_bad_fork();

}  // namespace c10::vnpu
