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

// torch_vnpu._C._inductor_launch_api: at::vnpu::InductorLaunchApi (csrc/inductor/KernelLaunch.h).
struct VnpuLaunchApi {{
    int version;
    int (*launch)(const char*, long, void (*)(void*), void*, void (*)(void*));
    int (*host_scalar)(PyObject*, void*, size_t, int);
    int (*launch_without_gil)(const char*, long, void (*)(void*), void*, void (*)(void*));
    int (*declare_access)(void*, int);
    const char* (*launch_or_error)(const char*, long, void (*)(void*), void*, void (*)(void*));
}};

static const VnpuLaunchApi* vnpu_launch_api() {{
    static const VnpuLaunchApi* api = nullptr;
    if (!api) {{
        auto* found = static_cast<const VnpuLaunchApi*>(PyCapsule_Import("torch_vnpu._C._inductor_launch_api", 0));
        if (found && found->version != 6) {{
            PyErr_SetString(PyExc_RuntimeError, "this compiled vnpu kernel was built for another torch_vnpu version");
            return nullptr;
        }}
        api = found;
    }}
    return api;
}}

template <typename... A> static PyObject* vnpu_launch(PyObject* pyargs, VnpuKernelName name, int64_t device, A... a) {{
    const VnpuLaunchApi* api = vnpu_launch_api();
    if (!api) return nullptr;
    auto* args = new VnpuKernelArgs{{a...}};
    if (vnpu_capture_host_scalars(args, pyargs, api->host_scalar) != 0) {{
        delete args;
        return nullptr;
    }}
    // The launch owns `args` from here on, also when it fails.
    if (api->launch(name.s, static_cast<long>(device), &vnpu_run, args, &vnpu_destroy) != 0) return nullptr;
    Py_RETURN_NONE;
}}
"""

# Bytes kept per pointer argument for a host scalar (Note [Host scalars in vnpu kernels] in
# csrc/inductor/KernelLaunch.h): the largest dtype, complex128.
_HOST_SCALAR_BYTES = 16


def _args_struct(argtypes: Sequence[str]) -> str:
    """C++ appended to the kernel's source: its arguments as a struct, and the functions that fill, run and free it.

    Pointer arguments that turn out to be CPU scalars at launch point into the struct's own copy of the value.
    """
    types = [t.replace("const ", "") for t in argtypes]
    members = "".join(f"    {t} a{i};\n" for i, t in enumerate(types))
    pointers = [i for i, t in enumerate(types) if t.endswith("*")]
    host = f"    alignas(16) unsigned char host[{len(pointers)}][{_HOST_SCALAR_BYTES}];\n" if pointers else ""
    capture = "".join(
        f"    if ((r = host_scalar(PyTuple_GET_ITEM(pyargs, {i + len(LAUNCH_ARG_TYPES)}), a->host[{k}], "
        f"{_HOST_SCALAR_BYTES}, {0 if 'const' in argtypes[i] else 1})) < 0) return -1;\n"
        f"    if (r) a->a{i} = reinterpret_cast<{types[i]}>(a->host[{k}]);\n"
        for k, i in enumerate(pointers)
    )
    call = ", ".join(f"a->a{i}" for i in range(len(types)))
    return (
        "\n#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n"
        f"struct VnpuKernelArgs {{\n{members}{host}}};\n"
        f"static void vnpu_run(void* p) {{ const auto* a = static_cast<VnpuKernelArgs*>(p); kernel({call}); }}\n"
        "static void vnpu_destroy(void* p) { delete static_cast<VnpuKernelArgs*>(p); }\n"
        "static int vnpu_capture_host_scalars(VnpuKernelArgs* a, PyObject* pyargs,\n"
        "                                     int (*host_scalar)(PyObject*, void*, size_t, int)) {\n"
        f"    int r = 0;\n{capture}    (void)r;\n    return 0;\n}}\n"
    )


@clear_on_fresh_cache
class VnpuCppPythonBindingsCodeCache(CppPythonBindingsCodeCache):
    """Inductor's C++ binding cache with a stream launch instead of a direct call."""

    cache: dict[str, Any] = {}
    call_entry_function = "return vnpu_launch(args, {});"
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
