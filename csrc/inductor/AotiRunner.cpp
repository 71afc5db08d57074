// AOTInductor's model runner for vnpu packages.
//
// Note [AOTInductor on vnpu]
// torch._inductor.aoti_load_package reads the package's AOTI_DEVICE_KEY
// ("vnpu") and asks libtorch's runner registry for that key; this file
// registers vnpu's runner when torch_vnpu is loaded. The generated model (built
// by torch_vnpu/_inductor/cpp_wrapper.py in AOT mode) has the execution model
// of the JIT C++ wrapper: buffers from the caching allocator, extern kernels
// through the dispatcher as vnpu ops (boxed c10::Dispatcher calls, and
// AOTInductor's proxy executor for ATen fallbacks), fused kernels enqueued on
// the current vnpu stream. Two things differ:
// * The model .so has no Python, so it cannot import the launch API capsule,
//   and dlsym(RTLD_DEFAULT) cannot find torch_vnpu's symbols either: Python
//   loads extension modules with RTLD_LOCAL. The runner hands the API to the
//   model instead, through the function torch_vnpu_aoti_attach that every vnpu
//   model exports, right after loading it.
// * AOTInductor's model runtime (aoti_runtime/model_base.h, compiled into the
//   model) knows the devices cpu/cuda/xpu/mps only, so the container is
//   created as a CPU model: it loads the package's weights as CPU tensors (the
//   constant blob). The runner copies each to the model's vnpu device once,
//   owns the copies, and hands the model a table of them by constant index,
//   which the model's code uses instead (checking that the CPU weight it
//   replaces is still the one that was copied).
#include "KernelLaunch.h"

#include "../core/VNPUFunctions.h"

#include <ATen/DynamicLibrary.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace at::vnpu {
namespace {

// Exported by every vnpu AOTInductor model: stores the launch API, the model's
// vnpu device and its weights by constant index (vnpu[i]: the AtenTensorHandle of
// the vnpu copy of constant i, whose CPU data was at cpu_data[i]; the arrays and
// handles are borrowed until the runner is destroyed). Returns nullptr or an
// error message.
using AttachFn = const char* (*)(const void* api, int api_version, long device, size_t num_constants,
                                 void* const* cpu_data, void* const* vnpu);

class AOTIModelContainerRunnerVnpu : public torch::inductor::AOTIModelContainerRunner {
 public:
  AOTIModelContainerRunnerVnpu(const std::string& model_so_path, size_t num_models, const std::string& device_str,
                               const std::string& bin_dir, bool run_single_threaded)
      // "cpu": the device the model's runtime is created for (Note [AOTInductor on vnpu]).
      : AOTIModelContainerRunner(model_so_path, num_models, "cpu", bin_dir, run_single_threaded) {
    const c10::Device device(device_str);
    TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "vnpu's AOTInductor runner got device ", device_str);
    const DeviceIndex index = device.has_index() ? device.index() : c10::vnpu::current_device();
    c10::vnpu::check_device_index(index);
    // The weights on vnpu, in the model's constant order, with the CPU weights' sizes and strides (the model's
    // code assumes them). Constants the container does not hold (folded ones) get no copy.
    const auto cpu_weights = extract_constants_map(/*use_inactive=*/false);  // by original FQN
    size_t num_constants = 0;
    TORCH_CHECK(get_num_constants_func_(container_handle_, &num_constants) == 0,  // AOTI_RUNTIME_SUCCESS
                "AOTInductorModelContainerGetNumConstants failed");
    for (size_t i = 0; i < num_constants; ++i) {
      const char* fqn = nullptr;
      TORCH_CHECK(get_constant_original_fqn_func_(container_handle_, i, &fqn) == 0,  // AOTI_RUNTIME_SUCCESS
                  "AOTInductorModelContainerGetConstantOriginalFQN failed");
      const auto it = cpu_weights.find(fqn);
      if (it == cpu_weights.end()) {
        cpu_data_.push_back(nullptr);
        vnpu_.push_back(nullptr);
        continue;
      }
      const at::Tensor& cpu = it->second;
      at::Tensor copy = at::empty_strided(cpu.sizes(), cpu.strides(),
                                          cpu.options().device(c10::Device(c10::DeviceType::PrivateUse1, index)));
      copy.copy_(cpu);
      cpu_data_.push_back(cpu.data_ptr());
      constants_.push_back(std::move(copy));
      vnpu_.push_back(&constants_.back());
    }
    // Complete before the first run on any stream.
    c10::vnpu::device_synchronize(index);
    auto attach = reinterpret_cast<AttachFn>(model_so_->sym("torch_vnpu_aoti_attach"));
    const char* error = attach(inductor_launch_api(), kInductorLaunchApiVersion, index, cpu_data_.size(),
                               cpu_data_.data(), vnpu_.data());
    TORCH_CHECK(error == nullptr, "cannot load this AOTInductor package on vnpu: ", error);
  }

 private:
  // The model borrows these (the table it was attached with) until the runner is destroyed.
  std::deque<at::Tensor> constants_;  // stable addresses: AtenTensorHandles of the vnpu weights
  std::vector<void*> cpu_data_;
  std::vector<void*> vnpu_;
};

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> create_runner(const std::string& model_so_path,
                                                                         size_t num_models,
                                                                         const std::string& device_str,
                                                                         const std::string& bin_dir,
                                                                         const bool run_single_threaded) {
  return std::make_unique<AOTIModelContainerRunnerVnpu>(model_so_path, num_models, device_str, bin_dir,
                                                        run_single_threaded);
}

const torch::inductor::RegisterAOTIModelRunner register_vnpu_runner("vnpu", &create_runner);

}  // namespace
}  // namespace at::vnpu
