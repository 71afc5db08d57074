"""VNPU_SANITIZE check 5: hard-coded CUDA reached from a program running on vnpu.

Code written for CUDA keeps running on another accelerator, but some of its CUDA calls silently switch features
off: ``torch.cuda.is_available()`` is False (the program takes its CPU branch), ``torch.cuda.is_bf16_supported()``
is False (it trains in fp32 or fp16), ``torch.autocast("cuda")`` and ``torch.cuda.amp.GradScaler()`` warn once
and disable themselves, ``torch.cuda.memory_allocated()`` answers 0, and ``"cuda" in device`` is False. With the
sanitizer on, each such call site is reported once, as a :class:`CudaCallWarning` at the user's file and line,
with the device-agnostic replacement (the table of ``python -m torch_vnpu.port.check``). Calls that raise anyway
(``.cuda()``, ``torch.cuda.set_device``) are reported too, before they raise, for the replacement.

How: the ``torch.cuda`` functions that have a replacement, ``torch.amp.GradScaler.__init__`` and
``torch.amp.autocast.__init__`` (for ``device="cuda"``; ``torch.cuda.amp``'s classes derive from them),
``torch.get_autocast_dtype`` / ``torch.is_autocast_enabled`` (for ``"cuda"``) and ``Tensor.cuda`` /
``nn.Module.cuda`` are wrapped, and ``Tensor.is_cuda`` read on a vnpu tensor is reported;
nothing on vnpu's own paths is. String comparisons cannot be
seen at run time: they are found statically (``torch_vnpu.port.check``) in the main script and in every file
that reaches a wrapped call. Under port mode (``torch_vnpu.port``), which maps CUDA calls to vnpu, nothing is
reported.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import Callable, NamedTuple

import torch

from ..patches import replace

__all__ = ["CudaCallWarning", "Report", "install", "installed", "uninstall", "reports"]


class CudaCallWarning(UserWarning):
    """A hard-coded CUDA call reached while vnpu is the accelerator (VNPU_SANITIZE check 5)."""


class Report(NamedTuple):
    filename: str
    lineno: int
    code: str  # what was called or compared, e.g. "torch.cuda.is_bf16_supported()"
    replacement: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}: {self.message()}"

    def message(self) -> str:
        return (f"hard-coded CUDA in a program running on vnpu: {self.code} -- instead: {self.replacement} "
                "(VNPU_SANITIZE check 5)")


_lock = threading.Lock()
_reports: list[Report] = []
_seen: set[tuple[str, int, str]] = set()
_scanned: set[str] = set()
_originals: list[tuple[object, str, object]] = []
# Frames not reported as the call site: torch, torch_vnpu, the standard library (functools, contextlib) and
# typing_extensions (torch.cuda.amp's deprecation wrappers).
_LIBRARY_DIRS = (os.path.dirname(torch.__file__) + os.sep,
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                 os.path.dirname(os.__file__) + os.sep)
_LIBRARY_FILES = tuple(
    os.path.abspath(m.__file__) for m in (sys.modules.get("typing_extensions"),) if m is not None and m.__file__)


def reports() -> list[Report]:
    """Every call site reported so far in this process, in order."""
    with _lock:
        return list(_reports)


# Installed third-party packages (transformers, torchao, ...): their CUDA tests are not the user's to change
# (the port mode maps them), so calls made there are not reported.
_THIRD_PARTY_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _is_library(frame) -> bool:
    path = frame.f_code.co_filename
    if path.startswith("<frozen"):
        return True
    path = os.path.abspath(path)
    return path.startswith(_LIBRARY_DIRS) or path in _LIBRARY_FILES


def _is_third_party(frame) -> bool:
    path = os.path.abspath(frame.f_code.co_filename)
    return any(d in path for d in _THIRD_PARTY_DIRS)


def _user_frame(frame, walk: bool):
    """``frame`` if it is user code; with ``walk``, the innermost user frame outside torch and torch_vnpu
    (torch.cuda.amp's classes call the torch.amp ones); else None (calls made by torch itself or by an installed
    package are not reported)."""
    while frame is not None and _is_library(frame):
        if not walk:
            return None
        frame = frame.f_back
    if frame is not None and _is_third_party(frame):
        return None
    return frame


def _port_mode() -> bool:
    port = sys.modules.get("torch_vnpu.port._cuda")
    return port is not None and port.is_enabled()


def _source_globals(filename: str, module_globals):
    """``module_globals`` for ``warn_explicit`` (it shows the source line through the module's loader), or None
    for code without a source file (``python -c``, stdin, ``exec``): there ``__main__``'s loader is the built-in
    importer, whose ``get_source`` raises ImportError inside the warning machinery."""
    return module_globals if module_globals is not None and os.path.isfile(filename) else None


def _emit(filename: str, lineno: int, code: str, replacement: str, module_globals=None) -> None:
    key = (filename, lineno)
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
        report = Report(filename, lineno, code, replacement)
        _reports.append(report)
    warnings.warn_explicit(report.message(), CudaCallWarning, filename, lineno,
                           module_globals=_source_globals(filename, module_globals))


def _scan(filename: str) -> None:
    """Report the string comparisons with "cuda" in a user source file (once per file)."""
    if _port_mode():
        return
    with _lock:
        if filename in _scanned:
            return
        _scanned.add(filename)
    try:
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        from torch_vnpu.port.check import check_source

        findings = check_source(source, filename)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return
    for finding in findings:
        # Only comparisons: calls are reported when they run, and so is ``is_cuda``, where it is read on an
        # accelerator tensor (on a CPU tensor False is right).
        if "compare" in finding.replacement:
            _emit(filename, finding.line, finding.code, finding.replacement)


def _report_call(caller, code: str, replacement: str, walk: bool) -> None:
    if _port_mode():
        return
    frame = _user_frame(caller, walk)
    if frame is None:
        return
    filename = frame.f_code.co_filename
    if os.path.isfile(filename):
        filename = os.path.abspath(filename)
    _emit(filename, frame.f_lineno, code, replacement, frame.f_globals)
    if os.path.isfile(filename):
        _scan(filename)


def _attributing_warnings(caller, original, args, kwargs):
    """Calls ``original``. Warnings it emits with a stacklevel that points at its caller (torch's "CUDA is not
    available. Disabling" of a CUDA GradScaler or autocast) would point at this wrapper: they are re-emitted at
    the user's line instead, the others unchanged. (``catch_warnings`` is process-wide: a warning another thread
    emits meanwhile is re-emitted from here, at its own location.)"""
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            return original(*args, **kwargs)
    finally:
        here = os.path.abspath(__file__)
        for w in caught:
            if os.path.abspath(w.filename) == here:
                user = _user_frame(caller, walk=True) or caller
                warnings.warn_explicit(w.message, w.category, user.f_code.co_filename, user.f_lineno,
                                       module_globals=_source_globals(user.f_code.co_filename, user.f_globals))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _wrap(owner: object, name: str, code: str | Callable[..., str], replacement: str,
          when: Callable[..., bool] | None = None, walk: bool | None = None) -> None:
    """Replace owner.name by a wrapper reporting calls made from user code (``code``: what was called, or a
    function of the call's arguments that says it; ``when``: which calls; ``walk``, by default for classes'
    ``__init__`` given ``when``: calls that a torch.cuda subclass made on the user's behalf too)."""
    original = getattr(owner, name)
    walk = when is not None if walk is None else walk

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if when is None or when(*args, **kwargs):
            _report_call(sys._getframe(1), code(*args, **kwargs) if callable(code) else code, replacement, walk)
        return _attributing_warnings(sys._getframe(1), original, args, kwargs)

    _originals.append((owner, name, original))
    replace(owner, name, wrapper, "sanitizer.cuda-calls")


def _class_call(obj, name: str, module: str) -> str:
    """How the user named the class: the deprecated ``torch.cuda.amp.X()`` or ``torch.amp``'s ``X("cuda")``."""
    if type(obj).__module__.startswith("torch.cuda.amp"):
        return f"torch.cuda.amp.{name}()"
    return f'{module}.{name}("cuda")'


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


def _wrap_is_cuda() -> None:
    """``x.is_cuda`` is False for a vnpu tensor, so ``if x.is_cuda:`` silently takes the other branch: reported
    when user code reads it on a tensor of the accelerator (not on CPU tensors, where False is right)."""
    original = torch.Tensor.is_cuda  # TensorBase's descriptor, inherited
    accelerator = torch.accelerator.current_accelerator()

    def is_cuda(self):
        result = original.__get__(self)
        if not result and accelerator is not None and self.device.type == accelerator.type:
            _report_call(sys._getframe(1), "Tensor.is_cuda",
                         "x.device.type == device.type (is_cuda is False on any other accelerator)", walk=False)
        return result

    _originals.append((torch.Tensor, "is_cuda", None))
    replace(torch.Tensor, "is_cuda", property(is_cuda, doc=original.__doc__), "sanitizer.cuda-calls")


def install() -> None:
    """Start reporting (idempotent). Called by ``torch.vnpu.sanitizer.enable()`` / ``VNPU_SANITIZE=1``."""
    if _originals:
        return
    from torch_vnpu.port.check import _CUDA_REPLACEMENTS

    for name, replacement in _CUDA_REPLACEMENTS.items():
        if "." not in name and callable(getattr(torch.cuda, name, None)) and not isinstance(getattr(torch.cuda, name), type):
            _wrap(torch.cuda, name, f"torch.cuda.{name}()", replacement)
    _wrap(torch.amp.GradScaler, "__init__", lambda self, *a, **k: _class_call(self, "GradScaler", "torch.amp"),
          'torch.amp.GradScaler(device.type) (a CUDA GradScaler disables itself without CUDA)',
          lambda self, device="cuda", *a, **k: _is_cuda(device))
    _wrap(torch.amp.autocast, "__init__", lambda self, *a, **k: _class_call(self, "autocast", "torch"),
          'torch.autocast(device.type, dtype=...) (a CUDA autocast disables itself without CUDA)',
          lambda self, device_type, *a, **k: _is_cuda(device_type))
    # Autocast state read for CUDA inside a vnpu autocast region: CUDA's (off, float16), not the region's.
    # torch.is_autocast_enabled() without a device and the *_gpu_* functions are the pre-2.4 spellings of CUDA's.
    _wrap(torch, "get_autocast_dtype", 'torch.get_autocast_dtype("cuda")', "torch.get_autocast_dtype(device.type)",
          lambda device_type=None, *a, **k: _is_cuda(device_type), walk=False)
    _wrap(torch, "is_autocast_enabled", lambda *a, **k: "torch.is_autocast_enabled(" + ('"cuda"' if a or k else "") + ")",
          "torch.is_autocast_enabled(device.type)",
          lambda device_type=None, *a, **k: device_type is None or _is_cuda(device_type), walk=False)
    for name in ("get_autocast_gpu_dtype", "set_autocast_gpu_dtype"):
        if callable(getattr(torch, name, None)):
            _wrap(torch, name, f"torch.{name}()", f"torch.{name.replace('_gpu', '')}(device.type, ...)", walk=False)
    _wrap(torch.Tensor, "cuda", "Tensor.cuda()", "x.to(device) with device = torch.accelerator.current_accelerator()")
    _wrap(torch.nn.Module, "cuda", "Module.cuda()", "module.to(device) with device = torch.accelerator.current_accelerator()")
    _wrap_is_cuda()
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and os.path.isfile(main) and not os.path.abspath(main).startswith(_LIBRARY_DIRS):
        _scan(os.path.abspath(main))


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return bool(_originals)


def uninstall() -> None:
    """Stop reporting and restore the wrapped functions (reports made so far are kept)."""
    while _originals:
        owner, name, original = _originals.pop()
        if original is None:
            delattr(owner, name)  # the attribute is inherited again
        else:
            setattr(owner, name, original)
    with _lock:
        _scanned.clear()
