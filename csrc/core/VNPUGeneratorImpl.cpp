#include "VNPUGeneratorImpl.h"

#include "VNPUFunctions.h"

#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/CallOnce.h>

#include <cstring>
#include <deque>
#include <mutex>

namespace at::vnpu {

VNPUGeneratorImpl::VNPUGeneratorImpl(DeviceIndex device_index)
    : c10::GeneratorImpl(Device(DeviceType::PrivateUse1, device_index),
                         DispatchKeySet(DispatchKey::PrivateUse1)) {}

void VNPUGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void VNPUGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "offset must be a multiple of 4, but got ", offset);
  offset_ = offset;
}

uint64_t VNPUGeneratorImpl::get_offset() const { return offset_; }
uint64_t VNPUGeneratorImpl::current_seed() const { return seed_; }

uint64_t VNPUGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(s);
  return s;
}

c10::intrusive_ptr<c10::TensorImpl> VNPUGeneratorImpl::get_state() const {
  auto state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  auto* p = state.data_ptr<uint8_t>();
  std::memcpy(p, &seed_, 8);
  std::memcpy(p + 8, &offset_, 8);
  return state.getIntrusivePtr();
}

void VNPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  // As CUDAGeneratorImpl::set_state: a contiguous CPU torch.ByteTensor (a vnpu tensor is rejected, as
  // a cuda one is on CUDA: its bytes may not even be written yet). Unlike CUDA, everything is
  // checked before anything changes, so a rejected state leaves the generator as it was.
  at::detail::check_rng_state(new_state);
  TORCH_CHECK(new_state.numel() == 16, "RNG state is wrong size: expected a vnpu RNG state of 16 bytes (seed, ",
              "offset, as from torch.vnpu.get_rng_state()), but got ", new_state.numel(), " bytes");
  const auto* p = static_cast<const uint8_t*>(new_state.data());
  uint64_t seed = 0, offset = 0;
  std::memcpy(&seed, p, 8);
  std::memcpy(&offset, p + 8, 8);
  TORCH_CHECK(offset % 4 == 0, "RNG state is invalid: its offset must be a multiple of 4, but got ", offset);
  seed_ = seed;
  offset_ = offset;
}

std::pair<uint64_t, uint64_t> VNPUGeneratorImpl::philox_engine_inputs(uint64_t increment) {
  increment = (increment + 3) / 4 * 4;
  auto r = std::make_pair(seed_, offset_);
  offset_ += increment == 0 ? 4 : increment;
  return r;
}

VNPUGeneratorImpl* VNPUGeneratorImpl::clone_impl() const {
  auto* g = new VNPUGeneratorImpl(device().index());
  g->seed_ = seed_;
  g->offset_ = offset_;
  return g;
}

const Generator& getDefaultVNPUGenerator(DeviceIndex device) {
  static std::deque<Generator>* gens = [] {
    auto* d = new std::deque<Generator>();  // never freed: Python holds references
    for (DeviceIndex i = 0; i < c10::vnpu::device_count(); ++i) {
      d->push_back(make_generator<VNPUGeneratorImpl>(i));
      d->back().set_current_seed(c10::default_rng_seed_val);
    }
    return d;
  }();
  if (device < 0) device = c10::vnpu::current_device();
  c10::vnpu::check_device_index(device);
  return (*gens)[device];
}

Generator createVNPUGenerator(DeviceIndex device) {
  if (device < 0) device = c10::vnpu::current_device();
  c10::vnpu::check_device_index(device);
  return make_generator<VNPUGeneratorImpl>(device);
}

}  // namespace at::vnpu
