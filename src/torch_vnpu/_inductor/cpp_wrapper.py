"""Inductor's C++ wrapper (``torch._inductor.config.cpp_wrapper = True``) for vnpu graphs.

Inductor's ``CppWrapperCpu`` generates the graph's entry function in C++; it
runs on the calling thread without the GIL, as the Python wrapper's ``call()``
does with it. vnpu keeps the Python wrapper's execution model (see
docs/ARCHITECTURE.md, "How a compiled graph reaches the stream"):

* buffers come from ``aoti_torch_empty_strided`` on the vnpu device, i.e. the
  caching allocator on the current stream;
* extern kernels (mm, convolution, sdpa, every ATen fallback) are called
  through the dispatcher (the C shim's ``aoti_torch_call_dispatcher``, or
  ``c10::Dispatcher`` for schemas the stable ABI cannot hold), so they are vnpu
  ops the executor enqueues on the current stream. CPU's C shims
  (``aoti_torch_cpu_mm_out``...) call ATen's CPU kernels directly, on the host,
  outside stream order: a vnpu graph never calls them;
* each fused C++ kernel of a vnpu node is enqueued on the current stream of the
  graph's device, with its arguments captured by value in a lambda
  (:data:`_RUNTIME_HEAD`), through ``InductorLaunchApi::launch_without_gil``
  (csrc/inductor/KernelLaunch.h); kernels of CPU nodes run on the host, as in
  the Python wrapper. Under ``VNPU_SANITIZE`` each launch first declares its
  vnpu pointer arguments' tensors (``declare_access``; a ``const`` pointer
  parameter is a read), as the Python wrapper's bindings do.

Errors: a launch error (bad device; a kernel's own error under
``VNPU_LAUNCH_BLOCKING=1``) raises the exception eager raises
(``torch.AcceleratorError``); extern kernels' C++ exceptions are translated
like eager's (:class:`VnpuCppWrapperCodeCache`). Kernel errors otherwise are
the runtime's sticky errors, naming the kernel and its graph.

AOTInductor (``aoti_compile_and_package``, :mod:`.aoti`) generates the same code in AOT
mode, with three differences (Note [AOTInductor on vnpu] in
csrc/inductor/AotiRunner.cpp): vnpu's model runner hands the launch API to the
model (``torch_vnpu_aoti_attach``: no Python, no capsule); the model's runtime is a
CPU one, so its weights load as CPU tensors and the graph uses the runner's vnpu
copies (``weight()``); launch errors are C++ exceptions, which AOTInductor's runner
raises as RuntimeError. The model also declares its inputs' devices
(``torch_vnpu_aoti_input_devices``), which the runner checks before every run.
"""

from __future__ import annotations

import re

import torch
from torch._inductor import ir
from torch._inductor.codecache import CppWrapperCodeCache
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.utils import clear_on_fresh_cache
from torch._inductor.virtualized import V

from .wrapper import _graph_label

_DEVICE = "vnpu"

# A vnpu device literal of a boxed dispatcher call, and its AOTInductor replacement (the loaded device).
_VNPU_DEVICE_LITERAL = re.compile(r"c10::Device\(at::kPrivateUse1, \d+\)")
_LOADED_DEVICE = "c10::Device(at::kPrivateUse1, static_cast<c10::DeviceIndex>(torch_vnpu_cpp_wrapper::device_index))"

# C++ spliced into the header of every C++ wrapper of a vnpu graph: _RUNTIME_HEAD, then the JIT or the AOT
# part (how the launch API is found and how a launch error is raised), then _RUNTIME_TAIL.
_RUNTIME_HEAD = r"""
// torch_vnpu: fused kernels on the vnpu stream (src/torch_vnpu/_inductor/cpp_wrapper.py,
// Note [Compiled kernels on the stream] in csrc/inductor/KernelLaunch.h).
#include <c10/core/DeviceGuard.h>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace torch_vnpu_cpp_wrapper {

// at::vnpu::InductorLaunchApi, version 6 (6: torch_vnpu_aoti_attach takes the weight table).
struct LaunchApi {
  int version;
  int (*launch)(const char*, long, void (*)(void*), void*, void (*)(void*));
  int (*host_scalar)(void*, void*, size_t, int);
  int (*launch_without_gil)(const char*, long, void (*)(void*), void*, void (*)(void*));
  int (*declare_access)(void*, int);
  const char* (*launch_or_error)(const char*, long, void (*)(void*), void*, void (*)(void*));
};
constexpr int kLaunchApiVersion = 6;

static const LaunchApi* api = nullptr;
"""

_RUNTIME_JIT = r"""
// Thrown when a Python exception is already set; the entry function returns it.
struct PythonErrorSet : std::runtime_error {
  PythonErrorSet() : std::runtime_error("torch_vnpu: a Python exception is set") {}
};

// Called at the top of the entry function, with the GIL held.
static inline void init() {
  if (api) return;
  auto* found = static_cast<const LaunchApi*>(PyCapsule_Import("torch_vnpu._C._inductor_launch_api", 0));
  if (!found) throw PythonErrorSet();
  if (found->version != kLaunchApiVersion) {
    PyErr_SetString(PyExc_RuntimeError, "this compiled vnpu graph was built for another torch_vnpu version");
    throw PythonErrorSet();
  }
  api = found;
}

// Enqueues kernel() on the current stream of vnpu device `device`; the lambda
// holds the kernel's arguments by value until it ran.
template <typename F>
static inline void launch(const char* name, int64_t device, F&& kernel) {
  using Fn = std::decay_t<F>;
  auto* fn = new Fn(std::forward<F>(kernel));
  if (api->launch_without_gil(name, static_cast<long>(device), [](void* p) { (*static_cast<Fn*>(p))(); }, fn,
                              [](void* p) { delete static_cast<Fn*>(p); }) != 0) {
    throw PythonErrorSet();
  }
}
"""

# AOTInductor (Note [AOTInductor on vnpu] in csrc/inductor/AotiRunner.cpp): no Python; vnpu's model runner
# hands over the launch API, the device and the weights' vnpu copies through torch_vnpu_aoti_attach.
_RUNTIME_AOT = r"""
// The vnpu device the package was loaded for (aoti_load_package's device_index, or the current device).
static long device_index = -1;

// The model's weights: the runner's table of vnpu copies, by buffer slot and constant index (Note [vnpu
// weights of an AOTInductor model] in csrc/inductor/AotiRunner.cpp).
static size_t num_weights = 0;
static void* const* weight_table = nullptr;

static inline void init() {
  if (!api) {
    throw std::runtime_error("this AOTInductor package was compiled for vnpu: load it with "
                             "torch._inductor.aoti_load_package, with torch_vnpu installed");
  }
}

// The vnpu copy of constant `index`, whose CPU constant in the container is `cpu`.
static inline torch::aot_inductor::ConstantHandle weight(size_t index, const torch::aot_inductor::ConstantHandle& cpu) {
  void* data = cpu.data_ptr();
  for (size_t slot = 0; index < num_weights && slot < 2; ++slot) {
    void* const* entry = weight_table + 2 * (slot * num_weights + index);
    void* vnpu = __atomic_load_n(&entry[1], __ATOMIC_ACQUIRE);
    if (vnpu != nullptr && __atomic_load_n(&entry[0], __ATOMIC_ACQUIRE) == data) {
      return torch::aot_inductor::ConstantHandle(static_cast<AtenTensorHandle>(vnpu));
    }
  }
  throw std::runtime_error("a weight of this vnpu AOTInductor model changed in a way vnpu's runner does not track: "
                           "update weights with load_constants / update_constant_buffer, or load the package again");
}

// The device guard of run_impl: the device the package was loaded for. The model runs on that device's
// current stream; vnpu's runner makes an explicit stream handle current before the run and passes none.
class AotiStreamGuard {
 public:
  AotiStreamGuard(void* stream, int32_t /*the CPU runtime's device_idx_*/)
      : guard_(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index))) {
    if (stream != nullptr) {
      throw std::invalid_argument("a vnpu AOTInductor model got a stream handle past vnpu's runner: load it "
                                  "with torch._inductor.aoti_load_package, with torch_vnpu installed");
    }
  }

 private:
  c10::DeviceGuard guard_;
};

template <typename F>
static inline void launch(const char* name, int64_t device, F&& kernel) {
  using Fn = std::decay_t<F>;
  auto* fn = new Fn(std::forward<F>(kernel));
  const char* error = api->launch_or_error(name, static_cast<long>(device), [](void* p) { (*static_cast<Fn*>(p))(); },
                                           fn, [](void* p) { delete static_cast<Fn*>(p); });
  if (error) throw std::runtime_error(error);
}

}  // namespace torch_vnpu_cpp_wrapper

// Called by vnpu's AOTInductor model runner right after it loaded this model.
extern "C" __attribute__((visibility("default"))) const char* torch_vnpu_aoti_attach(
    const void* launch_api, int version, long device, size_t num_weights, void* const* weight_table) {
  namespace w = torch_vnpu_cpp_wrapper;
  if (version != w::kLaunchApiVersion) return "it was compiled for another torch_vnpu version: compile it again";
  w::api = static_cast<const w::LaunchApi*>(launch_api);
  w::device_index = device;
  w::num_weights = num_weights;
  w::weight_table = weight_table;
  return nullptr;
}

namespace torch_vnpu_cpp_wrapper {
"""

_RUNTIME_TAIL = r"""
}  // namespace torch_vnpu_cpp_wrapper

// A dtype view (Inductor's reinterpret of a buffer as another dtype of the same width) is metadata only: CPU's
// shim calls ATen's device-independent view.dtype, so vnpu's is the same call.
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
inline AOTITorchError aoti_torch_vnpu_view_dtype(AtenTensorHandle self, int32_t dtype, AtenTensorHandle* ret) {
  return aoti_torch_cpu_view_dtype(self, dtype, ret);
}

namespace torch_vnpu_cpp_wrapper {
// Under VNPU_SANITIZE, declares the vnpu tensor's memory for the next launch
// (written if `writes`: a non-const pointer parameter); otherwise one relaxed load.
static inline void declare(AtenTensorHandle tensor, int writes) { api->declare_access(tensor, writes); }

// A pointer argument of a vnpu kernel whose tensor may be on the CPU: a 0-dim
// CPU tensor (an optimizer's step count) is copied at launch, since the host
// may change it before the kernel runs (Note [Host scalars in vnpu kernels]).
template <typename T>
class KernelPtr {
 public:
  explicit KernelPtr(AtenTensorHandle t) {
    void* data = nullptr;
    int32_t device_type = 0;
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_data_ptr(t, &data));
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t, &device_type));
    ptr_ = static_cast<T*>(data);
    if (device_type != aoti_torch_device_type_cpu()) return;
    int64_t numel = 0;
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_get_numel(t, &numel));
    if (numel > 1) {
      throw std::runtime_error("a compiled vnpu kernel can take a CPU tensor only as a scalar (0-dim), but got one of "
                               + std::to_string(numel) + " elements");
    }
    host_ = true;
    if (numel == 1) std::memcpy(value_, data, sizeof(T));
  }
  T* get() const { return host_ ? reinterpret_cast<T*>(const_cast<unsigned char*>(value_)) : ptr_; }

 private:
  static_assert(sizeof(T) <= 16, "host scalars are at most 16 bytes");
  T* ptr_ = nullptr;
  bool host_ = false;
  alignas(16) unsigned char value_[16] = {};
};

// Inductor's device guard of the graph's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int64_t index)
      : guard_(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index))) {}
  void set_index(int64_t index) { guard_.set_index(static_cast<c10::DeviceIndex>(index)); }

 private:
  c10::DeviceGuard guard_;
};

}  // namespace torch_vnpu_cpp_wrapper
"""


# The entry's catch clauses (CppWrapperCodeCache.extra_parse_arg, a str.format template: braces are doubled).
_STACK_PUSH = re.compile(r"^\s*dispatch_stack_\d+\.emplace_back\(")
_BASE_CATCH = re.compile(r"\}\} catch\(std::exception const& e\) \{\{.*?\"unhandled error\"\);\s*return nullptr;\s*\}\}",
                         re.S)
_VNPU_CATCH = """}} catch(...) {{
    // A vnpu launch error has set its Python exception; other C++ exceptions (an extern kernel's c10::Error,
    // AcceleratorError...) get the Python types eager ops raise.
    if (!PyErr_Occurred()) torch::translate_exception_to_python(std::current_exception());
    return nullptr;
}}"""


def _entry_with_eager_exceptions(extra_parse_arg: str) -> str:
    result, n = _BASE_CATCH.subn(lambda _: _VNPU_CATCH, extra_parse_arg)
    if n != 1:
        raise RuntimeError("torch_vnpu: Inductor's C++ wrapper entry changed; vnpu's error translation needs updating")
    declaration = (
        "#include <exception>\n"
        "namespace torch {{ void translate_exception_to_python(const std::exception_ptr&); }}  // libtorch_python\n"
    )
    return declaration + result


@clear_on_fresh_cache
class VnpuCppWrapperCodeCache(CppWrapperCodeCache):
    """``CppWrapperCodeCache`` whose entry raises eager's exception types (see the module docstring)."""

    cache: dict = {}
    extra_parse_arg = _entry_with_eager_exceptions(CppWrapperCodeCache.extra_parse_arg)

    @staticmethod
    def cache_clear() -> None:
        VnpuCppWrapperCodeCache.cache.clear()


# Schema defaults of ScalarType/Layout/MemoryFormat arguments are their C++ enum values (c10/core/ScalarType.h,
# Layout.h, MemoryFormat.h); the boxed call's code generator takes the Python objects.
_ENUMS = {
    "ScalarType": dict(enumerate([torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                                  torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
                                  torch.bool, torch.qint8, torch.quint8, torch.qint32, torch.bfloat16])),
    "Layout": {0: torch.strided},
    "MemoryFormat": {0: torch.contiguous_format, 1: torch.preserve_format, 2: torch.channels_last,
                     3: torch.channels_last_3d},
}


def _enum_value(value, arg_type):
    """``value`` of an argument of schema type ``arg_type``, an int enum value replaced by its Python object."""
    if isinstance(arg_type, torch.OptionalType):
        arg_type = arg_type.getElementType()
    table = _ENUMS.get(repr(arg_type))
    if table is None or not isinstance(value, int) or isinstance(value, bool):
        return value
    if value not in table:
        raise NotImplementedError(f"AOTInductor on vnpu: {arg_type} value {value} of a fallback kernel")
    return table[value]


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class VnpuCppWrapperCodegen(CppWrapperCpu):
    """``CppWrapperCpu`` for vnpu graphs: fused kernels on the stream, extern kernels through the dispatcher."""

    def __init__(self) -> None:
        self.device = _DEVICE
        super().__init__()
        self.needs_vec_isa = True  # the fused kernels are Inductor's CPU (vectorised) C++

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if V.graph.aot_mode and V.graph.const_module is not None:
            # Not done: the folding graph is a second C++ wrapper spliced into the model (vnpu's runtime header
            # would be emitted twice), and its outputs, vnpu tensors, would enter the CPU-created container's
            # constants, which vnpu's weight table (csrc/inductor/AotiRunner.cpp) does not hold.
            raise NotImplementedError(
                "AOTInductor on vnpu: runtime constant folding (aot_inductor.use_runtime_constant_folding) is not "
                "supported; compile without it (Inductor still folds constants at compile time)"
            )
        return VnpuCppWrapperCodegen()

    # -- header, entry and loading ------------------------------------------------------------------------

    def add_device_include(self, device: str) -> None:
        if device != _DEVICE:
            return super().add_device_include(device)
        if device in self.included_devices:
            return
        self.included_devices.add(device)
        if V.graph.aot_mode:
            # The AOT runtime of a CPU model (Note [AOTInductor on vnpu] in csrc/inductor/AotiRunner.cpp).
            self.header.splice(self.get_device_include_path_aot("cpu"))
            self.header.splice(_RUNTIME_HEAD + _RUNTIME_AOT + _RUNTIME_TAIL)
        else:
            self.header.splice("#include <torch/csrc/inductor/cpp_wrapper/common.h>")
            self.header.splice(_RUNTIME_HEAD + _RUNTIME_JIT + _RUNTIME_TAIL)

    def _codegen_entry_impl_prologue(self) -> None:
        self.prefix.writeline("torch_vnpu_cpp_wrapper::init();")

    def _write_constants_unpacking(self) -> None:
        if not V.graph.aot_mode:
            return super()._write_constants_unpacking()
        # AOTInductor: the model's constants are CPU tensors; the graph uses their vnpu copies.
        for idx, name in enumerate(V.graph.constants.keys()):
            self.prefix.writeline(f"[[maybe_unused]] auto {name} = torch_vnpu_cpp_wrapper::weight({idx}, constants_->at({idx}));")

    def codegen_model_constructor(self) -> None:
        # AOTInductor: the model is a CPU model whose weights load as CPU tensors (the runner copies them to
        # vnpu): their constants_info_ device type is the CPU's.
        self._constants_on_cpu = True
        try:
            super().codegen_model_constructor()
        finally:
            self._constants_on_cpu = False
        # The device of each input, which vnpu's runner checks before every run (Note [Input devices of a vnpu
        # AOTInductor model] in csrc/inductor/AotiRunner.cpp): 'v' the loaded vnpu device, 'c' the CPU, '-' unchecked.
        codes = {_DEVICE: "v", "cpu": "c"}
        devices = "".join(
            codes.get(value.get_device().type, "-")
            if isinstance(value, ir.TensorBox) and value.get_device() is not None else "-"
            for value in V.graph.graph_inputs.values()
        )
        self.prefix.writeline(
            f'extern "C" __attribute__((visibility("default"))) const char* torch_vnpu_aoti_input_devices() '
            f'{{ return "{devices}"; }}'
        )

    def codegen_device(self, device):
        if getattr(self, "_constants_on_cpu", False) and device.type == _DEVICE:
            device = torch.device("cpu")
        return super().codegen_device(device)

    def codegen_device_idx(self, device, device_id):
        index = super().codegen_device_idx(device, device_id)
        # AOTInductor: the model runtime is a CPU one; the vnpu device is the one the package was loaded for.
        return "torch_vnpu_cpp_wrapper::device_index" if index == "this->device_idx_" else index

    def _launch_device(self, device) -> str:
        """The vnpu device index a fused kernel of ``device`` is launched on (C++ expression)."""
        if V.graph.aot_mode:
            return "torch_vnpu_cpp_wrapper::device_index"
        return str(device.index if device.index is not None else torch.vnpu.current_device())

    def _generate_end_jit(self, result) -> None:
        # Built as CPU code (the kernels are; -O3, OpenMP, vectorisation), loaded by vnpu's code cache.
        self.device = "cpu"
        try:
            super()._generate_end_jit(result)
        finally:
            self.device = _DEVICE
        loads = [i for i, line in enumerate(result._lines)
                 if isinstance(line, str) and "CppWrapperCodeCache.load_pybinding(" in line]
        if len(loads) != 1:
            raise RuntimeError("torch_vnpu: Inductor's C++ wrapper loader changed; vnpu's needs updating")
        line = result._lines[loads[0]]
        indent = line[: len(line) - len(line.lstrip())]
        result._lines[loads[0]] = line.replace("CppWrapperCodeCache.load_pybinding(",
                                               "VnpuCppWrapperCodeCache.load_pybinding(")
        result._lines.insert(loads[0], f"{indent}from torch_vnpu._inductor.cpp_wrapper import VnpuCppWrapperCodeCache")

    # -- fused kernels --------------------------------------------------------------------------------------

    def _is_on_vnpu(self, name: str) -> bool:
        buffer = V.graph.try_get_buffer(name)
        device = buffer.get_device() if buffer is not None else None
        return device is not None and device.type == _DEVICE

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, arg_types=None,
                                     **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != _DEVICE:
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton,
                                                        arg_types=arg_types, **kwargs)
        assert arg_types is not None and len(call_args) == len(arg_types)
        index = self._launch_device(device)
        captures, params, declares = [], [], []
        for i, (arg, arg_type) in enumerate(zip(call_args, arg_types)):
            arg = str(arg)
            if isinstance(arg_type, str) and "*" in arg_type:
                if self._is_on_vnpu(arg):
                    captures.append(f"a{i} = ({arg_type})({arg}.data_ptr())")
                    params.append(f"a{i}")
                    # VNPU_SANITIZE: as the Python wrapper's binding declares them (host_scalar): const = read.
                    writes = 0 if "const" in arg_type else 1
                    declares.append(f"torch_vnpu_cpp_wrapper::declare({arg}, {writes});")
                else:
                    element = arg_type.replace("*", "").strip()
                    captures.append(f"a{i} = torch_vnpu_cpp_wrapper::KernelPtr<{element}>({arg})")
                    params.append(f"a{i}.get()")
            else:
                captures.append(f"a{i} = {arg}")
                params.append(f"a{i}")
        name = _c_string(f"{kernel_name} ({_graph_label()})")
        for line in declares:
            self.writeline(line)
        self.writeline(
            f"torch_vnpu_cpp_wrapper::launch({name}, {index}, [{', '.join(captures)}]() "
            f"{{ {kernel_name}({', '.join(params)}); }});"
        )

    # -- extern kernels: through the dispatcher ----------------------------------------------------------------

    @staticmethod
    def _require_operator(node) -> None:
        if not isinstance(node.op_overload, torch._ops.OpOverload):
            raise NotImplementedError(
                f"cpp_wrapper=True on vnpu: extern kernel {node.get_kernel_name()} has no ATen operator to "
                "dispatch; compile with cpp_wrapper=False"
            )

    def generate_fallback_kernel_with_runtime_lookup_boxed(self, op_overload, raw_args, output_args,
                                                           raw_outputs) -> None:
        start = len(self.lines)
        super().generate_fallback_kernel_with_runtime_lookup_boxed(op_overload, raw_args, output_args, raw_outputs)
        # None for a (non-optional) Tensor argument, e.g. efficient attention backward's attn_bias without a mask:
        # the generator emits c10::IValue(), which the dispatcher's unboxing rejects ("Expected Tensor but got
        # None"); ATen means an undefined tensor there (CUDA's C shim passes a null handle).
        tensor_args = [isinstance(a.type, torch.TensorType) for a in op_overload._schema.arguments]
        k = 0
        for i in range(start, len(self.lines)):
            line = self.lines[i]
            if isinstance(line, str) and _STACK_PUSH.match(line):
                if k < len(tensor_args) and tensor_args[k] and line.rstrip().endswith(".emplace_back(c10::IValue());"):
                    self.lines[i] = line.replace("emplace_back(c10::IValue());", "emplace_back(c10::IValue(at::Tensor()));")
                k += 1

    def _dispatch(self, op_overload, raw_args, output_args, raw_outputs) -> None:
        """A boxed dispatcher call of ``op_overload``: the vnpu op, which the executor enqueues."""
        start = len(self.lines)
        self.generate_fallback_kernel_with_runtime_lookup_boxed(op_overload, raw_args, output_args, raw_outputs)
        if V.graph.aot_mode:
            # A vnpu device argument is the device the package was loaded for, not the one it was compiled on.
            for i in range(start, len(self.lines)):
                if isinstance(self.lines[i], str):
                    self.lines[i] = _VNPU_DEVICE_LITERAL.sub(_LOADED_DEVICE, self.lines[i])

    # AOTInductor runs ATen fallbacks through its proxy executor, which replaces every Device argument by the
    # runner's device: the CPU for vnpu's CPU-created model (Note [AOTInductor on vnpu] in
    # csrc/inductor/AotiRunner.cpp), so randperm(n, device=vnpu) would make a CPU tensor. Fallbacks with a
    # Device argument are boxed dispatcher calls instead, like the JIT C++ wrapper's.
    def _boxed_fallback_in_aot(self, buf_name, op_overload):
        """The FallbackKernel of ``buf_name`` if it is a vnpu AOT fallback with a Device argument, else None."""
        if not V.graph.aot_mode or not isinstance(op_overload, torch._ops.OpOverload):
            return None

        def has_device(t) -> bool:
            return has_device(t.getElementType()) if isinstance(t, torch.OptionalType) else isinstance(
                t, torch.DeviceObjType)

        if not any(has_device(a.type) for a in op_overload._schema.arguments):
            return None
        node = V.graph.try_get_buffer(buf_name)
        if not isinstance(node, ir.FallbackKernel) or not self._on_vnpu(node):
            return None
        if not self._compatible_with_cpp_boxed_dispatch(op_overload):
            raise NotImplementedError(f"AOTInductor on vnpu: fallback {op_overload} takes a device but its schema "
                                      "cannot be called through the dispatcher from C++; compile without AOTInductor")
        return node

    def generate_fallback_kernel_with_runtime_lookup(self, buf_name, python_kernel_name, get_args, op_overload,
                                                     raw_args, outputs) -> None:
        self._fallback_node = self._boxed_fallback_in_aot(buf_name, op_overload)
        try:
            super().generate_fallback_kernel_with_runtime_lookup(buf_name, python_kernel_name, get_args, op_overload,
                                                                 raw_args, outputs)
        finally:
            self._fallback_node = None

    def generate_fallback_kernel_with_runtime_lookup_aot(self, op_overload, raw_args, output_args,
                                                         raw_outputs) -> None:
        node = getattr(self, "_fallback_node", None)
        if node is None:
            return super().generate_fallback_kernel_with_runtime_lookup_aot(op_overload, raw_args, output_args,
                                                                           raw_outputs)
        # The arguments in schema order, as FallbackKernel.export_extern_kernel_node gives them in JIT mode.
        args, kwargs = node.unflatten_args(node.inputs, node.constant_args)
        args = node.fill_non_provided_args(args, kwargs)
        ordered_kwargs = [node.get_kwargs_value(key, **kwargs) for key in node.ordered_kwargs_for_cpp_kernel]
        values = [_enum_value(v, a.real_type) for v, a in zip([*args, *ordered_kwargs], op_overload._schema.arguments)]
        self._dispatch(op_overload, values, output_args, raw_outputs)

    @staticmethod
    def _schema_args(node, *, out=None) -> list:
        """``node``'s arguments in its operator's schema order (inputs first, then kwargs or defaults)."""
        positional = [*node.inputs, *node.constant_args]
        values = []
        for arg in node.op_overload._schema.arguments:
            if arg.name == "out" and out is not None:
                values.append(out)
            elif positional and not arg.kwarg_only:
                values.append(positional.pop(0))
            elif arg.name in node.kwargs:
                values.append(node.kwargs[arg.name])
            elif arg.has_default_value():
                values.append(arg.default_value)
            else:
                raise NotImplementedError(f"cpp_wrapper=True on vnpu: no value for argument {arg.name!r} of "
                                          f"{node.op_overload}; compile with cpp_wrapper=False")
        if positional:
            raise NotImplementedError(f"cpp_wrapper=True on vnpu: unexpected arguments {positional} of "
                                      f"{node.op_overload}; compile with cpp_wrapper=False")
        return values

    @staticmethod
    def _on_vnpu(node) -> bool:
        device = node.get_device()
        return device is None or device.type == _DEVICE

    def generate_fallback_kernel(self, node: ir.FallbackKernel) -> None:
        if not self._on_vnpu(node):
            return super().generate_fallback_kernel(node)
        # The dispatcher instead of CPU's C shims (the call FallbackKernel.codegen makes for ops without a shim).
        self.generate_fallback_kernel_with_runtime_lookup(
            node.get_name(),
            node.python_kernel_name,
            lambda: [*node.codegen_args(), *node.codegen_kwargs()],
            node.op_overload,
            node.export_extern_kernel_node(),
            node.outputs if node.outputs else node.mutation_outputs,
        )

    def generate_extern_kernel_out(self, node: ir.ExternKernelOut) -> None:
        if not self._on_vnpu(node):
            return super().generate_extern_kernel_out(node)
        self._require_operator(node)
        node.codegen_comment(self)
        returns = len(node.op_overload._schema.returns)
        out = node.output_view if node.output_view else node
        self._dispatch(node.op_overload, self._schema_args(node, out=out), [None] * returns, [None] * returns)

    def generate_extern_kernel_alloc(self, node: ir.ExternKernelAlloc) -> None:
        if not self._on_vnpu(node):
            return super().generate_extern_kernel_alloc(node)
        self._require_operator(node)
        if getattr(node, "outputs", None) or isinstance(node.layout, ir.NoneLayout):
            raise NotImplementedError(f"cpp_wrapper=True on vnpu: extern kernel {node.op_overload} with several "
                                      "or no outputs; compile with cpp_wrapper=False")
        node.codegen_comment(self)
        self._dispatch(node.op_overload, self._schema_args(node), [node.get_name()], [node])
        if isinstance(node.layout, ir.Layout):
            node.codegen_size_asserts(self)

    def generate_scatter_fallback(self, node: ir.ScatterFallback) -> None:
        if not self._on_vnpu(node):
            return super().generate_scatter_fallback(node)
        if node.src_is_tensor:
            x, index, src = node.inputs
            (dim,) = node.constant_args
        else:
            x, index = node.inputs
            dim, src = node.constant_args
        values = [x, dim, index, src]
        for arg in node.op_overload._schema.arguments[4:]:
            values.append(node.kwargs[arg.name] if arg.name in node.kwargs else arg.default_value)
        returns = len(node.op_overload._schema.returns)
        self._dispatch(node.op_overload, values, [None] * returns, [None] * returns)

    def generate_index_put_fallback(self, node: ir.IndexPutFallback) -> None:
        if not self._on_vnpu(node):
            return super().generate_index_put_fallback(node)
        valid = iter(node.inputs[2:])
        indices = [next(valid) if i is not None else None for i in node.indices]
        values = [node.inputs[0], indices, node.inputs[1], node.constant_args[0]]
        returns = len(node.op_overload._schema.returns)
        self._dispatch(node.op_overload, values, [None] * returns, [None] * returns)

    def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs) -> None:
        if device == _DEVICE:  # CPU's shims would run a CPU kernel on vnpu memory on the host
            raise NotImplementedError(f"cpp_wrapper=True on vnpu: extern kernel {kernel} has no dispatcher route; "
                                      "compile with cpp_wrapper=False")
        super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)
