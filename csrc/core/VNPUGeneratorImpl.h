// The vnpu random number Generator (mirrors at::CUDAGeneratorImpl).
//
// State is Philox-style: a 64-bit seed and a 64-bit offset. Every random
// kernel takes (seed, offset) at enqueue time and advances the offset by the
// number of values it may draw (rounded up to a multiple of 4, as CUDA does),
// so results depend only on the seed and the op sequence, never on timing.
// get_state() is a uint8 CPU tensor of 16 bytes: seed then offset, the layout
// DTensor's RNG tracker reads from CUDA generators.
//
// The values themselves come from ATen's CPU kernels with a CPU generator
// seeded from (seed, offset); they differ from CUDA's and from CPU's streams.
// Threads: the generator's mutex_ guards seed/offset (as for CUDA generators).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace at::vnpu {

struct VNPUGeneratorImpl final : public c10::GeneratorImpl {
  explicit VNPUGeneratorImpl(DeviceIndex device_index = -1);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;  // picks and sets a non-deterministic seed
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // Returns (seed, offset) and advances the offset by `increment` values
  // (rounded up to a multiple of 4). Caller must hold mutex_.
  std::pair<uint64_t, uint64_t> philox_engine_inputs(uint64_t increment);

 private:
  VNPUGeneratorImpl* clone_impl() const override;
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

// The default generator of `device` (-1: current device).
const Generator& getDefaultVNPUGenerator(DeviceIndex device = -1);
Generator createVNPUGenerator(DeviceIndex device = -1);

}  // namespace at::vnpu
