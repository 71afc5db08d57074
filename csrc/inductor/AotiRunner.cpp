// AOTInductor's model runner for vnpu packages.
//
// Note [AOTInductor on vnpu]
// torch._inductor.aoti_load_package reads the package's AOTI_DEVICE_KEY
// ("vnpu") and asks libtorch's runner registry for that key; this file
// registers vnpu's runner when torch_vnpu is loaded. The generated model (built
// by src/torch_vnpu/_inductor/cpp_wrapper.py in AOT mode) has the execution model
// of the JIT C++ wrapper: buffers from the caching allocator, extern kernels
// (ATen fallbacks included) through the dispatcher as vnpu ops, fused kernels
// enqueued on the current vnpu stream. Three things differ:
// * The model .so has no Python, so it cannot import the launch API capsule,
//   and dlsym(RTLD_DEFAULT) cannot find torch_vnpu's symbols either: Python
//   loads extension modules with RTLD_LOCAL. The runner hands the API to the
//   model instead, through the function torch_vnpu_aoti_attach that every vnpu
//   model exports, right after loading it.
// * AOTInductor's model runtime (aoti_runtime/model_base.h, compiled into the
//   model) knows the devices cpu/cuda/xpu/mps only, so the container is
//   created as a CPU model: it holds the package's weights as CPU tensors, in
//   two constant buffers (active and inactive, for update-then-swap). The
//   runner keeps a vnpu copy of each, by buffer slot and constant index, with
//   the CPU data pointer it was copied from (Note [vnpu weights of an
//   AOTInductor model]); the model's code looks its weights up there.
// * An explicit stream handle (AOTInductor's run(inputs, stream)) is a
//   vnpuStream_t: the runner makes it the current stream for the run.
// * The runner checks the inputs' devices before every run (Note [Input
//   devices of a vnpu AOTInductor model]).
#include "KernelLaunch.h"

#include "../core/VNPUFunctions.h"
#include "../core/VNPUStream.h"

#include <ATen/DynamicLibrary.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace at::vnpu {
namespace {

// Note [vnpu weights of an AOTInductor model]
// The weight table the model is attached with: for buffer slot s (0, 1) and
// constant index i, the pair table[2 * (s * n + i)] = the CPU data pointer of
// the container's constant the vnpu copy was made from, table[... + 1] = the
// AtenTensorHandle of that vnpu copy (nullptr: none). The model takes the
// entry whose CPU pointer is the one of its current constant, so a swap of the
// container's buffers (done under the container's lock) needs nothing from the
// runner. Updates write the vnpu handle last (atomically), and old copies stay
// alive until the device has finished the work queued before the update.
//
// Exported by every vnpu AOTInductor model: stores the launch API, the model's
// vnpu device and the weight table (borrowed until the runner is destroyed).
// Returns nullptr or an error message.
using AttachFn = const char* (*)(const void* api, int api_version, long device, size_t num_constants,
                                 void* const* table);

// Note [Input devices of a vnpu AOTInductor model]
// The model reads each input where it was compiled to: a fused kernel captures a vnpu input's data pointer and
// reads it later, on the stream of the device the package was loaded for. Given a tensor elsewhere, nothing
// fails: a CPU tensor's host memory is read asynchronously (the caller may change it meanwhile; CUDA's kernels
// would fault on the host pointer), a tensor of another vnpu device is read without waiting for that device's
// stream. torch.compile's code guards on devices; AOTInductor checks them only under
// AOTI_RUNTIME_CHECK_INPUTS=1, and only the device type. So the runner checks every input's device before each
// run (one compare per input) and raises eager's device mismatch. The model declares the devices, one character
// per input, from its exported torch_vnpu_aoti_input_devices(): 'v' the vnpu device the package was loaded
// for, 'c' the CPU, '-' unchecked (src/torch_vnpu/_inductor/cpp_wrapper.py). A zero-size tensor is checked too
// (its device is wrong all the same; its data is never touched). AOTInductor's own checks (dtype, shape,
// strides under AOTI_RUNTIME_CHECK_INPUTS=1) run in the model afterwards.
using InputDevicesFn = const char* (*)();

class AOTIModelContainerRunnerVnpu;

// Container handle -> runner, for the container functions the runner intercepts (plain function pointers).
std::mutex g_runners_mutex;
std::unordered_map<AOTInductorModelContainerHandle, AOTIModelContainerRunnerVnpu*>& runners() {
  static auto* map = new std::unordered_map<AOTInductorModelContainerHandle, AOTIModelContainerRunnerVnpu*>();
  return *map;
}
AOTIModelContainerRunnerVnpu* runner_of(AOTInductorModelContainerHandle handle);

using ConstantMap = std::unordered_map<std::string, AtenTensorHandle>;

class AOTIModelContainerRunnerVnpu : public torch::inductor::AOTIModelContainerRunner {
 public:
  AOTIModelContainerRunnerVnpu(const std::string& model_so_path, size_t num_models, const std::string& device_str,
                               const std::string& bin_dir, bool run_single_threaded)
      // "cpu": the device the model's runtime is created for (Note [AOTInductor on vnpu]).
      : AOTIModelContainerRunner(model_so_path, num_models, "cpu", bin_dir, run_single_threaded) {
    const c10::Device device(device_str);
    TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1, "vnpu's AOTInductor runner got device ", device_str);
    device_ = device.has_index() ? device.index() : c10::vnpu::current_device();
    c10::vnpu::check_device_index(device_);
    TORCH_CHECK(get_num_constants_func_(container_handle_, &num_constants_) == 0,  // AOTI_RUNTIME_SUCCESS
                "AOTInductorModelContainerGetNumConstants failed");
    for (size_t i = 0; i < num_constants_; ++i) {
      const char* name = nullptr;
      const char* fqn = nullptr;
      TORCH_CHECK(get_constant_name_func_(container_handle_, i, &name) == 0 &&
                      get_constant_original_fqn_func_(container_handle_, i, &fqn) == 0,
                  "AOTInductorModelContainerGetConstantName/OriginalFQN failed");
      names_.emplace_back(name);
      fqns_.emplace_back(fqn);
      index_of_name_.emplace(names_.back(), i);
    }
    load_input_devices();
    table_.assign(4 * num_constants_, nullptr);
    for (auto& slot : copies_) slot.resize(num_constants_);
    refresh_slot(0, /*updated=*/nullptr, /*use_inactive=*/false);
    // Complete before the first run on any stream.
    c10::vnpu::device_synchronize(device_);
    auto attach = reinterpret_cast<AttachFn>(model_so_->sym("torch_vnpu_aoti_attach"));
    const char* error = attach(inductor_launch_api(), kInductorLaunchApiVersion, device_, num_constants_,
                               table_.data());
    TORCH_CHECK(error == nullptr, "cannot load this AOTInductor package on vnpu: ", error);
    // Weight updates and buffer swaps keep the vnpu copies current.
    orig_update_ = update_constant_buffer_func_;
    orig_swap_ = swap_constant_buffer_func_;
    orig_free_inactive_ = free_inactive_constant_buffer_func_;
    orig_update_from_blob_ = update_constants_from_blob_func_;
    update_constant_buffer_func_ = &update_hook;
    update_user_managed_constant_buffer_func_ = &update_user_managed_hook;
    update_constant_buffer_from_cpu_func_ = &update_from_cpu_hook;
    update_inactive_constant_buffer_func_ = &update_inactive_hook;
    swap_constant_buffer_func_ = &swap_hook;
    free_inactive_constant_buffer_func_ = &free_inactive_hook;
    update_constants_from_blob_func_ = &update_from_blob_hook;
    std::lock_guard<std::mutex> lock(g_runners_mutex);
    runners()[container_handle_] = this;
  }

  ~AOTIModelContainerRunnerVnpu() override {
    {
      std::lock_guard<std::mutex> lock(g_runners_mutex);
      runners().erase(container_handle_);
    }
    // Queued runs may still read the weights.
    try {
      c10::vnpu::device_synchronize(device_);
    } catch (...) {  // a sticky kernel error: the work has stopped, the memory may go
    }
  }

 protected:
  // An explicit stream handle is a vnpuStream_t of the model's device: the run is enqueued on it, as
  // AOTInductor on CUDA runs on the cudaStream_t it is given; without one, on the current stream.
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles, void* stream_handle) override {
    check_input_devices(input_handles);
    if (stream_handle == nullptr) return AOTIModelContainerRunner::run_impl(input_handles, nullptr);
    const c10::StreamId id = c10::vnpu::streamIdOf(device_, static_cast<vnpuStream_t>(stream_handle));
    TORCH_CHECK_VALUE(id >= 0, "the stream handle given to this AOTInductor model is not a stream of vnpu:",
                      static_cast<int>(device_), ", the device the package was loaded for: pass ",
                      "torch.vnpu.Stream.vnpu_stream of a stream of that device");
    c10::StreamGuard guard(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_), id));
    return AOTIModelContainerRunner::run_impl(input_handles, nullptr);
  }

 private:
  // The expected device of each input and its name (Note [Input devices of a vnpu AOTInductor model]).
  void load_input_devices() {
    InputDevicesFn input_devices = nullptr;
    try {
      input_devices = reinterpret_cast<InputDevicesFn>(model_so_->sym("torch_vnpu_aoti_input_devices"));
    } catch (const c10::Error&) {
    }
    TORCH_CHECK(input_devices != nullptr, "cannot load this AOTInductor package on vnpu: it was compiled by an older "
                "torch_vnpu (its model does not declare its inputs' devices): compile it again");
    const auto get_num_inputs =
        reinterpret_cast<decltype(&AOTInductorModelContainerGetNumInputs)>(model_so_->sym("AOTInductorModelContainerGetNumInputs"));
    const auto get_input_name =
        reinterpret_cast<decltype(&AOTInductorModelContainerGetInputName)>(model_so_->sym("AOTInductorModelContainerGetInputName"));
    size_t num_inputs = 0;
    check(get_num_inputs(container_handle_, &num_inputs), "AOTInductorModelContainerGetNumInputs");
    const std::string devices = input_devices();
    TORCH_CHECK(devices.size() == num_inputs, "cannot load this AOTInductor package on vnpu: its model declares ",
                devices.size(), " input devices for ", num_inputs, " inputs");
    for (size_t i = 0; i < num_inputs; ++i) {
      const char* name = nullptr;
      check(get_input_name(container_handle_, i, &name), "AOTInductorModelContainerGetInputName");
      input_names_.emplace_back(name ? name : "");
      switch (devices[i]) {
        case 'v': input_devices_.emplace_back(c10::Device(c10::DeviceType::PrivateUse1, device_)); break;
        case 'c': input_devices_.emplace_back(c10::Device(c10::kCPU)); break;
        default: input_devices_.emplace_back(std::nullopt);
      }
    }
  }

  void check_input_devices(std::vector<AtenTensorHandle>& handles) {
    if (handles.size() != input_devices_.size()) return;  // the container raises its own count error
    for (size_t i = 0; i < handles.size(); ++i) {
      const auto& expected = input_devices_[i];
      if (!expected) continue;
      const at::Tensor* t = handles[i] ? torch::aot_inductor::tensor_handle_to_tensor_pointer(handles[i]) : nullptr;
      if (C10_UNLIKELY(t == nullptr || !t->defined() || t->device() != *expected)) raise_input_device_error(handles, i);
    }
  }

  [[noreturn]] C10_NOINLINE void raise_input_device_error(std::vector<AtenTensorHandle>& handles, size_t i) {
    const at::Tensor* t = handles[i] ? torch::aot_inductor::tensor_handle_to_tensor_pointer(handles[i]) : nullptr;
    const bool defined = t != nullptr && t->defined();
    const std::string actual = defined ? t->device().str() : std::string();
    // The handles are the model's to steal; it does not run, so they are released here.
    for (auto& handle : handles) {
      if (handle != nullptr) aoti_torch_delete_tensor_object(handle);
      handle = nullptr;
    }
    const c10::Device expected = *input_devices_[i];
    // The index counts the call's tensors in flattened order; the name is the model's (arg<i>_1).
    const std::string which = "input " + std::to_string(i) + " (" + input_names_[i] + ") of this AOTInductor package";
    TORCH_CHECK(defined, which, " is an undefined tensor: the package expects a tensor on ", expected);
    // Eager's message for mixed devices (as on CUDA), then which input and what to do.
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", expected,
                " and ", actual, "! ", which, " is on ", actual, ", the package reads it on ", expected,
                ": move it there with .to(\"", expected, "\")");
  }

  static void check(AOTIRuntimeError error, const char* what) {
    TORCH_CHECK(error == 0, what, " failed");  // AOTI_RUNTIME_SUCCESS
  }

  // The container's CPU constants of one buffer, by constant index (undefined where it holds none).
  std::vector<at::Tensor> cpu_constants(bool use_inactive) {
    ConstantMap by_fqn;
    check(extract_constants_map_func_(container_handle_, reinterpret_cast<AOTInductorConstantMapHandle>(&by_fqn),
                                      use_inactive),
          "AOTInductorModelContainerExtractConstantsMap");
    std::vector<at::Tensor> result(num_constants_);
    for (size_t i = 0; i < num_constants_; ++i) {
      const auto it = by_fqn.find(fqns_[i]);
      if (it != by_fqn.end() && it->second != nullptr) {
        result[i] = *torch::aot_inductor::tensor_handle_to_tensor_pointer(it->second);
      }
    }
    return result;
  }

  // Makes slot `slot`'s vnpu copies match the container's CPU constants of that buffer: constants in
  // `updated` (by constant index: the user's tensor) are taken from the user's tensor, the others are copied
  // again only where their CPU data moved. Copies are enqueued on the current stream; the caller
  // synchronizes the device before old copies are released (retired_).
  void refresh_slot(int slot, const std::vector<const at::Tensor*>* updated, bool use_inactive,
                    const std::vector<bool>* alias = nullptr) {
    const auto cpu = cpu_constants(use_inactive);
    for (size_t i = 0; i < num_constants_; ++i) {
      void** entry = &table_[2 * (slot * num_constants_ + i)];
      const at::Tensor* source = updated ? (*updated)[i] : nullptr;
      if (!cpu[i].defined()) {  // folded, or not in this buffer
        if (source == nullptr) continue;
      } else if (source == nullptr && copies_[slot][i] && entry[0] == cpu[i].data_ptr()) {
        continue;  // unchanged
      }
      const at::Tensor& layout = cpu[i].defined() ? cpu[i] : *source;
      std::unique_ptr<at::Tensor> copy;
      if (alias && (*alias)[i]) {
        copy = std::make_unique<at::Tensor>(*source);
      } else {
        copy = std::make_unique<at::Tensor>(at::empty_strided(
            layout.sizes(), layout.strides(),
            layout.options().device(c10::Device(c10::DeviceType::PrivateUse1, device_))));
        copy->copy_(source ? *source : cpu[i], /*non_blocking=*/true);
      }
      void* new_cpu = cpu[i].defined() ? cpu[i].data_ptr() : nullptr;
      if (entry[0] != new_cpu) {
        __atomic_store_n(&entry[1], nullptr, __ATOMIC_RELEASE);
        __atomic_store_n(&entry[0], new_cpu, __ATOMIC_RELEASE);
      }
      __atomic_store_n(&entry[1], static_cast<void*>(copy.get()), __ATOMIC_RELEASE);
      if (copies_[slot][i]) retired_.push_back(std::move(copies_[slot][i]));
      copies_[slot][i] = std::move(copy);
    }
  }

  // Waits for the device (queued runs may read retired copies; new copies complete before any stream's next
  // run, as a CUDA model's weight update does with cudaMemcpy), then releases the retired copies.
  void finish_update() {
    c10::vnpu::device_synchronize(device_);
    retired_.clear();
  }

  // load_constants / update_constant_buffer on vnpu: the model's constants are vnpu tensors, as a CUDA
  // model's are CUDA tensors: vnpu tensors are accepted (any vnpu device: copied), CPU tensors only with
  // allow_h2d_copy; with user_managed, vnpu tensors of the model's device with the constant's layout are
  // used directly (no copy: later in-place changes are seen, as on CUDA). The container gets CPU copies in
  // the constants' layout (it checks and keeps CPU constants).
  void update(const ConstantMap& given, bool use_inactive, bool validate_full_update, bool user_managed,
              bool allow_cpu) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto current = cpu_constants(/*use_inactive=*/false);
    std::vector<const at::Tensor*> updated(num_constants_, nullptr);
    std::vector<bool> alias(num_constants_, false);
    std::vector<at::Tensor> cpu_copies;
    cpu_copies.reserve(given.size());
    ConstantMap for_container;
    for (const auto& [name, handle] : given) {
      const auto it = index_of_name_.find(name);
      TORCH_CHECK(it != index_of_name_.end(), "AOTInductor model on vnpu: no constant named ", name);
      const size_t i = it->second;
      TORCH_CHECK(handle != nullptr, "AOTInductor model on vnpu: constant ", fqns_[i], " is None");
      const at::Tensor& t = *torch::aot_inductor::tensor_handle_to_tensor_pointer(handle);
      const at::Tensor& expected = current[i];
      const bool on_vnpu = t.device().type() == c10::DeviceType::PrivateUse1;
      TORCH_CHECK(on_vnpu || (t.device().is_cpu() && allow_cpu && !user_managed),
                  "update_constant_buffer: constant '", name, "' is on ", t.device(),
                  " but the model's constants are on vnpu:", static_cast<int>(device_),
                  (t.device().is_cpu() ? (user_managed ? " (user-managed constants must be vnpu tensors)"
                                                       : " (pass allow_h2d_copy=True to copy CPU tensors)")
                                       : ""));
      if (expected.defined()) {
        TORCH_CHECK(t.sizes() == expected.sizes() && t.scalar_type() == expected.scalar_type(),
                    "update_constant_buffer: constant '", fqns_[i], "' has shape ", t.sizes(), " and dtype ",
                    t.scalar_type(), ", the model's has shape ", expected.sizes(), " and dtype ",
                    expected.scalar_type());
      }
      if (user_managed) {
        TORCH_CHECK(t.device().index() == device_ && (!expected.defined() || t.strides() == expected.strides()),
                    "update_constant_buffer: user-managed constant '", fqns_[i], "' must be a vnpu:",
                    static_cast<int>(device_), " tensor with the model's strides ",
                    (expected.defined() ? expected.strides() : t.strides()), " (got ", t.device(), ", strides ",
                    t.strides(), ")");
        alias[i] = true;
      }
      const at::Tensor& layout = expected.defined() ? expected : t;
      at::Tensor cpu = at::empty_strided(layout.sizes(), layout.strides(), layout.options().device(c10::kCPU));
      cpu.copy_(t);
      cpu_copies.push_back(cpu);
      for_container.emplace(name, torch::aot_inductor::tensor_pointer_to_tensor_handle(&cpu_copies.back()));
      updated[i] = &t;
    }
    // The container checks a full update, copies into its buffer, and keeps the CPU constants.
    check(orig_update_(container_handle_, reinterpret_cast<AOTInductorConstantMapHandle>(&for_container),
                       use_inactive, validate_full_update),
          "AOTInductorModelContainerUpdateConstantBuffer");
    refresh_slot(use_inactive ? 1 - active_slot_ : active_slot_, &updated, use_inactive, &alias);
    finish_update();
  }

  void swap() {
    std::lock_guard<std::mutex> lock(mutex_);
    check(orig_swap_(container_handle_), "AOTInductorModelContainerSwapConstantBuffer");
    active_slot_ = 1 - active_slot_;
  }

  void free_inactive() {
    std::lock_guard<std::mutex> lock(mutex_);
    check(orig_free_inactive_(container_handle_), "AOTInductorModelContainerFreeInactiveConstantBuffer");
    const int slot = 1 - active_slot_;
    for (size_t i = 0; i < num_constants_; ++i) {
      void** entry = &table_[2 * (slot * num_constants_ + i)];
      __atomic_store_n(&entry[1], nullptr, __ATOMIC_RELEASE);
      __atomic_store_n(&entry[0], nullptr, __ATOMIC_RELEASE);
      if (copies_[slot][i]) retired_.push_back(std::move(copies_[slot][i]));
    }
    finish_update();
  }

  void update_from_blob(const uint8_t* blob) {
    std::lock_guard<std::mutex> lock(mutex_);
    check(orig_update_from_blob_(container_handle_, blob), "AOTInductorModelUpdateConstantsFromBlob");
    // The container copies into its active buffer in place (same CPU pointers): copy every constant again.
    const int slot = active_slot_;
    for (size_t i = 0; i < num_constants_; ++i) {
      if (copies_[slot][i]) retired_.push_back(std::move(copies_[slot][i]));
    }
    refresh_slot(slot, nullptr, /*use_inactive=*/false);
    finish_update();
  }

  // The container functions the runner calls, replaced (the runner's weight methods are not virtual).
  template <typename F>
  static AOTIRuntimeError hook(AOTInductorModelContainerHandle handle, F&& f) {
    f(runner_of(handle));  // errors propagate as C++ exceptions: the runner's caller gets the message
    return 0;              // AOTI_RUNTIME_SUCCESS
  }
  static AOTIRuntimeError update_hook(AOTInductorModelContainerHandle h, AOTInductorConstantMapHandle m,
                                      bool use_inactive, bool validate) {
    return hook(h, [&](auto* r) { r->update(*reinterpret_cast<ConstantMap*>(m), use_inactive, validate, false, false); });
  }
  static AOTIRuntimeError update_user_managed_hook(AOTInductorModelContainerHandle h, AOTInductorConstantMapHandle m,
                                                   bool use_inactive, bool validate) {
    return hook(h, [&](auto* r) { r->update(*reinterpret_cast<ConstantMap*>(m), use_inactive, validate, true, false); });
  }
  static AOTIRuntimeError update_from_cpu_hook(AOTInductorModelContainerHandle h, AOTInductorConstantMapHandle m,
                                               bool use_inactive, bool validate) {
    return hook(h, [&](auto* r) { r->update(*reinterpret_cast<ConstantMap*>(m), use_inactive, validate, false, true); });
  }
  static AOTIRuntimeError update_inactive_hook(AOTInductorModelContainerHandle h, AOTInductorConstantMapHandle m) {
    return hook(h, [&](auto* r) { r->update(*reinterpret_cast<ConstantMap*>(m), true, true, false, false); });
  }
  static AOTIRuntimeError swap_hook(AOTInductorModelContainerHandle h) {
    return hook(h, [](auto* r) { r->swap(); });
  }
  static AOTIRuntimeError free_inactive_hook(AOTInductorModelContainerHandle h) {
    return hook(h, [](auto* r) { r->free_inactive(); });
  }
  static AOTIRuntimeError update_from_blob_hook(AOTInductorModelContainerHandle h, const uint8_t* blob) {
    return hook(h, [&](auto* r) { r->update_from_blob(blob); });
  }

  c10::DeviceIndex device_ = 0;
  std::vector<std::optional<c10::Device>> input_devices_;  // by input index; nullopt: unchecked
  std::vector<std::string> input_names_;
  size_t num_constants_ = 0;
  std::vector<std::string> names_;  // by constant index: the container's constant name
  std::vector<std::string> fqns_;   // by constant index: the original FQN
  std::unordered_map<std::string, size_t> index_of_name_;
  std::vector<void*> table_;  // Note [vnpu weights of an AOTInductor model]; the model borrows it
  std::array<std::vector<std::unique_ptr<at::Tensor>>, 2> copies_;  // owners of the table's vnpu handles
  std::vector<std::unique_ptr<at::Tensor>> retired_;                // replaced copies, until the device is idle
  int active_slot_ = 0;
  std::mutex mutex_;  // serializes weight updates and swaps

  decltype(update_constant_buffer_func_) orig_update_ = nullptr;
  decltype(swap_constant_buffer_func_) orig_swap_ = nullptr;
  decltype(free_inactive_constant_buffer_func_) orig_free_inactive_ = nullptr;
  decltype(update_constants_from_blob_func_) orig_update_from_blob_ = nullptr;
};

AOTIModelContainerRunnerVnpu* runner_of(AOTInductorModelContainerHandle handle) {
  std::lock_guard<std::mutex> lock(g_runners_mutex);
  const auto it = runners().find(handle);
  TORCH_CHECK(it != runners().end(), "vnpu AOTInductor runner: unknown model container");
  return it->second;
}

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
