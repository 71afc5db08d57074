"""Bindings that launch Inductor's C++ kernels on the current vnpu stream.

Inductor's CPU backend compiles every fused kernel with a Python binding that
turns tensor arguments into raw pointers and calls the kernel at once, on the
calling thread. On vnpu the graph's extern kernels (mm, convolution, sdpa) are
queued on the current stream by the eager executor, so calling a fused kernel on
the host would read their outputs before they are written. This binding parses
the same arguments on the calling thread (pointers and symbolic sizes, by
value) and enqueues the kernel on the current stream of the graph's device
through ``torch_vnpu._C._inductor_launch``, like a CUDA kernel launch; see Note
[Compiled kernels on the stream] in csrc/inductor/KernelLaunch.h.

A kernel defined with :func:`cpp_pybinding` is called as
``kernel(name, device_index, *kernel_args)``: ``name`` (str) names the kernel in
asynchronous error messages, ``device_index`` (int) picks the vnpu device.
"""

from __future__ import annotations

from typing import Any, Sequence

from torch._inductor.async_compile import AsyncCompile, get_compile_threads
from torch._inductor.codecache import CppPythonBindingsCodeCache, LambdaFuture
from torch._inductor.utils import clear_on_fresh_cache

# Leading parameters of every vnpu kernel binding (see the module docstring).
LAUNCH_ARG_TYPES = ["VnpuKernelName", "int64_t"]

# C++ appended to the binding (a str.format template: braces are doubled). The arguments travel in a
# plain struct generated per kernel (_args_struct): a std::tuple of a foreach kernel's ~150 arguments made
# gcc -O3 take over 15 minutes.
_LAUNCH_SUPPORT = r"""
struct VnpuKernelName {{ const char* s; }};
template <> inline VnpuKernelName parse_arg<VnpuKernelName>(PyObject* args, size_t n) {{
    const char* s = PyUnicode_AsUTF8(PyTuple_GET_ITEM(args, n));
    if (!s) [[unlikely]] throw std::runtime_error("expected the kernel name (str) as first argument");
    return VnpuKernelName{{s}};
}}

// torch_vnpu._C._inductor_launch: at::vnpu::inductor_launch (KernelLaunch.h).
using vnpu_launch_fn = int (*)(const char*, long, void (*)(void*), void*, void (*)(void*));

template <typename... A> static PyObject* vnpu_launch(VnpuKernelName name, int64_t device, A... a) {{
    static vnpu_launch_fn launch = nullptr;
    if (!launch) {{
        launch = reinterpret_cast<vnpu_launch_fn>(PyCapsule_Import("torch_vnpu._C._inductor_launch", 0));
        if (!launch) return nullptr;
    }}
    // inductor_launch owns `args` from here on, also when it fails.
    auto* args = new VnpuKernelArgs{{a...}};
    if (launch(name.s, static_cast<long>(device), &vnpu_run, args, &vnpu_destroy) != 0) return nullptr;
    Py_RETURN_NONE;
}}
"""


def _args_struct(argtypes: Sequence[str]) -> str:
    """C++ appended to the kernel's source: its arguments as a struct, and the functions that run and free it."""
    members = "".join(f"    {t.replace('const ', '')} a{i};\n" for i, t in enumerate(argtypes))
    call = ", ".join(f"a->a{i}" for i in range(len(argtypes)))
    return (
        f"\nstruct VnpuKernelArgs {{\n{members}}};\n"
        f"static void vnpu_run(void* p) {{ const auto* a = static_cast<VnpuKernelArgs*>(p); kernel({call}); }}\n"
        "static void vnpu_destroy(void* p) { delete static_cast<VnpuKernelArgs*>(p); }\n"
    )


@clear_on_fresh_cache
class VnpuCppPythonBindingsCodeCache(CppPythonBindingsCodeCache):
    """Inductor's C++ binding cache with a stream launch instead of a direct call."""

    cache: dict[str, Any] = {}
    call_entry_function = "return vnpu_launch({});"
    extra_parse_arg = _LAUNCH_SUPPORT

    @staticmethod
    def cache_clear() -> None:
        VnpuCppPythonBindingsCodeCache.cache.clear()


def cpp_pybinding(async_compile: AsyncCompile, argtypes: Sequence[str], source_code: str) -> Any:
    """``async_compile.cpp_pybinding`` for vnpu: the binding of ``source_code``'s ``kernel``.

    argtypes: C++ types of ``kernel``'s parameters (e.g. ``["const float*", "int64_t"]``).
    Returns the callable, or a future that ``async_compile.wait`` resolves when
    Inductor compiles in parallel (as ``AsyncCompile.cpp_pybinding``).
    """
    source_code += _args_struct(argtypes)
    argtypes = [*LAUNCH_ARG_TYPES, *argtypes]
    if get_compile_threads() <= 1:
        return VnpuCppPythonBindingsCodeCache.load_pybinding(argtypes, source_code)
    get_result = VnpuCppPythonBindingsCodeCache.load_pybinding_async(
        argtypes, source_code, submit_fn=async_compile.submit
    )
    return LambdaFuture(get_result)
