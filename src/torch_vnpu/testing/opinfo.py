"""OpInfo parity sweep: every OpInfo of PyTorch's ``op_db`` on vnpu compared with CPU.

For each OpInfo and each supported dtype (of the selected ones) the sweep runs, on CPU and on vnpu with
the same inputs (copied with the same sizes, strides and storage offsets):

* forward: every sample input and every reference input through the functional variant, the in-place
  variant (the result must be the input tensor, as on CPU) and the ``out=`` variant (the result must be
  the ``out`` tensor(s), as on CPU). Outputs are compared with ``torch.testing.assert_close`` (the OpInfo's
  ``toleranceOverride`` where it has one, else the dtype's defaults), plus dtype, shape, device (vnpu),
  view aliasing (an output that is a view of an input on CPU must be one on vnpu) and the inputs after the
  call (an op must mutate its inputs on vnpu exactly as on CPU);
* grad (float32/float64, ``supports_autograd``): backward of a random-weighted sum (fixed seed) of the
  outputs, input gradients compared;
* error: every ``error_inputs`` case must raise on vnpu an exception of CPU's type (or a subclass);
  kernel errors that surface asynchronously are attributed by synchronizing inside the case.

Samples are generated on vnpu as PyTorch's device tests generate them on CUDA (tensors the OpInfo
creates without a device stay on CPU on both sides), on CPU and moved if that fails; error inputs are
generated on CPU and all their tensors moved. Random ops (the CPU call draws from the default CPU
generator, or the OpInfo has ``has_nondeterministic_output``) are compared by dtype/shape/device only and counted as ``random``.
A case that fails on CPU as well is ``cpu_failed``. Every case is guarded (exceptions, ``signal.alarm``
timeout); with ``jobs >= 1`` cases run in spawned worker processes watched by the parent, so a crash or
a hang that the alarm cannot interrupt is reported as a failure of that case and the sweep goes on in a
fresh worker.

Entry points: :func:`main` (command line, see ``scripts/opinfo_parity.py``), :func:`run_sweep`
(returns the result dict), :func:`write_markdown`.
"""

import argparse
import collections
import fnmatch
import itertools
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
import warnings

DTYPE_NAMES = ["float32", "float64", "bfloat16", "float16", "complex64", "int64", "int32", "int8", "uint8", "bool"]
GRAD_DTYPES = ["float32", "float64"]
KINDS = ["forward", "grad", "error"]
STATUSES = ["passed", "failed", "skipped", "cpu_failed"]
ERROR_DTYPE = "any"  # error inputs bring their own dtypes; they run once per op
MSG_LEN = 600

# Layout variants of every sample (issue #13, item 15): the same computation on inputs laid out differently in
# memory. PyTorch's TestCommon.test_noncontiguous_samples builds "noncontig"; CPU and vnpu get the same layout.
#   noncontig:  every contiguous tensor becomes a strided view of a twice-as-large buffer, its gaps filled with
#               NaN (floats), True or 12, so a kernel that reads the wrong elements gives visibly wrong values;
#               out= tensors likewise (PyTorch's test_out case 2)
#   transposed: tensors of >= 2 non-trivial dims in reversed (column-major) memory order; out= tensors too
#   expanded:   stride 0 in the innermost non-trivial dim (values repeat along it, as after expand())
#   offset:     a contiguous view that starts 3 elements into its storage (storage_offset 3); out= tensors too
#   channels_last: 4-D and 5-D tensors in channels-last memory format (as CNNs use them); out= tensors too
LAYOUTS = ["noncontig", "transposed", "expanded", "offset", "channels_last"]

# Errors that CUDA, too, raises only asynchronously (device-side asserts on the data, e.g. an index out of
# range): on vnpu they surface at the next synchronization as torch.AcceleratorError, as on CUDA. Every other
# error input must raise at the call, as on CPU (issue #13, item 11).
ASYNC_ON_CUDA = {
    "gather": "index out of range: CUDA_KERNEL_ASSERT in the gather kernel",
    "scatter": "index out of range: CUDA_KERNEL_ASSERT in the scatter kernel",
    "scatter_add": "index out of range: CUDA_KERNEL_ASSERT in the scatter kernel",
}

# Ops whose outputs contain uninitialized memory besides the has_nondeterministic_output ones.
UNINITIALIZED_OUTPUT_OPS = {"resize_", "resize_as_"}
# Ops whose result has the layout of the CUDA kernel vnpu runs, not CPU's (values are compared as usual; the layout
# is asserted by the named test).
CUDA_LAYOUT_OPS = {
    "nn.functional.scaled_dot_product_attention": "efficient attention's output layout, [B, L, H, D] viewed as "
                                                  "[B, H, L, D] (tests/test_attention.py)",
}
# dtypes in which in-place calls that would have to resize self are checked (inplace_broadcast_case)
INPLACE_BROADCAST_DTYPES = {"float32"}


# --------------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------------

def op_key(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def case_kind_label(kind, variant, layout=None):
    """The kind column of failing-case lists: forward, forward:inplace, forward:out, grad, error, with
    ``@<layout>`` appended for a layout variant of the sample (e.g. ``forward:out@noncontig``)."""
    label = kind if variant in ("", "fn", None) else f"{kind}:{variant}"
    return f"{label}@{layout}" if layout else label


def _short(msg, n=MSG_LEN):
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def _exc_msg(e):
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # keep the informative head of long (e.g. assert_close, or C++ backtrace) messages
    head = []
    for ln in lines:
        if ln.startswith("Exception raised from") or ln.strip().startswith("frame #"):
            break
        head.append(ln.strip())
        if len(head) >= 6:
            break
    return f"{type(e).__name__}: {_short(' | '.join(head))}"


class CaseTimeout(BaseException):
    """Raised by SIGALRM in a case; BaseException so that ops' own `except Exception` do not eat it."""


class _Alarm:
    def __init__(self, seconds):
        self.seconds = int(seconds) if seconds else 0

    def __enter__(self):
        if self.seconds > 0 and hasattr(signal, "SIGALRM"):
            def handler(signum, frame):
                raise CaseTimeout()
            self.old = signal.signal(signal.SIGALRM, handler)
            signal.alarm(self.seconds)
        return self

    def __exit__(self, *exc):
        if self.seconds > 0 and hasattr(signal, "SIGALRM"):
            signal.alarm(0)
            signal.signal(signal.SIGALRM, self.old)
        return False


def select_ops(op_db, patterns):
    """Indices into op_db of the OpInfos matching any of the comma-separated names / glob patterns
    (matched against ``name`` and ``name.variant_test_name``)."""
    if not patterns:
        return list(range(len(op_db)))
    pats = [p.strip() for p in ",".join(patterns).split(",") if p.strip()]
    out = []
    for i, op in enumerate(op_db):
        key = op_key(op)
        if any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(op.name, p) for p in pats):
            out.append(i)
    return out


# --------------------------------------------------------------------------------------------------
# the per-case machinery (runs in a worker process, or in-process with --jobs 0)
# --------------------------------------------------------------------------------------------------

def _overlaps_itself(t):
    """True if two elements of strided tensor `t` share a memory location (exact, by enumerating offsets;
    OpInfo samples are small). ATen's own check answers "too hard" for every non-contiguous tensor."""
    import torch

    if t.numel() <= 1 or torch._debug_has_internal_overlap(t) == 0:
        return False
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = (offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride)
    return offsets.reshape(-1).unique().numel() < t.numel()


def _padded(t):
    """`t` (values and strides kept) in a zero-filled storage with a margin on both sides: a CPU out= kernel that
    writes past its out tensor (tril/triu with some layouts) then hits the margin, not the allocator's data."""
    import torch

    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return t
    extent = t.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if st > 0)
    pad = extent * 2 + 64
    r = t.new_zeros(extent + 2 * pad).as_strided(t.shape, t.stride(), pad + t.storage_offset())
    return r.copy_(t)


def layout_tensor(t, layout, out=False):
    """`t` (a strided tensor) with the memory layout `layout` (see LAYOUTS): same shape, dtype, device and
    requires_grad; same values except for "expanded" (t's first slice repeated along the innermost non-trivial
    dim). Returns t itself when the layout does not apply (0-dim, empty, already non-contiguous for
    "noncontig", fewer than two non-trivial dims for "transposed", and "expanded" for out= tensors)."""
    import torch

    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.dim() == 0 or t.numel() == 0:
        return t
    big = [d for d in range(t.dim()) if t.shape[d] > 1]
    with torch.no_grad():
        src = t.detach()
        if layout == "noncontig":
            if not t.is_contiguous():
                return t
            from torch.testing._internal.common_utils import noncontiguous_like

            r = noncontiguous_like(src)
        elif layout == "transposed":
            if len(big) < 2:
                return t
            perm = list(range(t.dim()))[::-1]
            r = src.permute(perm).contiguous().permute(perm)
        elif layout == "expanded":
            if out or not big:
                return t
            r = src.narrow(big[-1], 0, 1).clone().expand(t.shape)
        elif layout == "offset":
            r = src.new_empty(t.numel() + 3)[3:].view(t.shape)
            r.copy_(src)
        elif layout == "channels_last":
            if t.dim() not in (4, 5) or len(big) < 2:
                return t
            fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
            r = src.contiguous(memory_format=fmt)
            if r.data_ptr() == src.data_ptr():
                return t
        else:
            raise ValueError(f"unknown layout {layout!r}; choose from {LAYOUTS}")
    return r.requires_grad_(t.requires_grad)


class OpRunner:
    """Runs every case of one OpInfo and reports each through ``emit(record)``."""

    def __init__(self, opts, emit, on_start=None, on_phase=None):
        import torch

        self.torch = torch
        self.on_phase = on_phase or (lambda phase: None)
        self.phase = "cpu"
        self.opts = opts
        self.emit = emit
        self.on_start = on_start or (lambda rec: None)
        self.dev = torch.device("vnpu")
        self.timeout = opts.get("timeout", 60)
        self.dtypes = {n: getattr(torch, n) for n in DTYPE_NAMES}

        from torch.utils._python_dispatch import TorchDispatchMode

        class SeededOpProbe(TorchDispatchMode):
            """Sees whether an ATen op tagged nondeterministic_seeded runs."""

            def __init__(self):
                super().__init__()
                self.random = False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if torch.Tag.nondeterministic_seeded in func.tags:
                    self.random = True
                return func(*args, **(kwargs or {}))

        self.SeededOpProbe = SeededOpProbe
        self.random_cache = {}

        class RandomDetector:
            """Detects random ops in a CPU call by a change of the default CPU generator's state (OpInfos
            of random ops reseed and restore it (wrapper_set_seed): see is_random, a separate probe)."""

            def __init__(self):
                self.random = False

            def __enter__(self):
                self.state = torch.default_generator.get_state()
                return self

            def __exit__(self, *exc):
                if not torch.equal(self.state, torch.default_generator.get_state()):
                    self.random = True
                return False

        self.RandomDetector = RandomDetector

    # ---------------------------------------------------------------- device helpers
    def set_phase(self, phase):
        """'cpu' while the CPU reference runs, 'vnpu' after: a hang or timeout in the CPU reference
        (e.g. polygamma_ on overlapping memory loops on CPU) is cpu_failed, not a vnpu failure."""
        self.phase = phase
        self.on_phase(phase)

    def sync(self):
        self.torch.vnpu.synchronize()

    def drain(self):
        """Make sure no error of this case is pending on the device."""
        for _ in range(3):
            try:
                with _Alarm(self.timeout):
                    self.sync()
                return True
            except CaseTimeout:
                return False
            except Exception:
                continue
        return True

    def copy_tensor(self, t, device, requires_grad=False):
        """A copy of t on device with the same sizes, strides and storage offset (a leaf)."""
        torch = self.torch
        t = t.detach()
        if t.layout != torch.strided:
            r = t.to(device, copy=True)
        else:
            if t.is_conj():
                t = t.resolve_conj()
            if t.is_neg():
                t = t.resolve_neg()
            if t.numel() == 0:
                r = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
            else:
                extent = t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(t.size(), t.stride()))
                flat = t.as_strided((extent,), (1,), 0)
                base = flat.to(device, copy=True)
                r = base.as_strided(t.size(), t.stride(), t.storage_offset()).detach()
        if requires_grad:
            r.requires_grad_(True)
        return r

    def convert(self, obj, target, master, keep_grad, memo):
        """Recursively copy the tensors of a sample for a run on `target` (cpu or vnpu).

        `master` is the device type the sample was generated on. Its tensors go to `target`, with the same
        sizes/strides/offset. CPU tensors of a vnpu-generated sample stay on CPU on both sides: the OpInfo
        made them without a device (index tensors, CPU scalars), and PyTorch's device tests keep them so on
        CUDA. Tensors on other devices (meta) are left alone. Devices among the arguments follow."""
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            k = id(obj)
            if k not in memo:
                if obj.device.type == master:
                    dest = target
                elif obj.device.type == "cpu":
                    dest = torch.device("cpu")
                else:
                    return obj
                if dest.type == "vnpu":
                    memo["moved"] = True
                memo[k] = self.copy_tensor(obj, dest, keep_grad and obj.requires_grad)
            return memo[k]
        if isinstance(obj, torch.device):
            if obj.type == master:
                memo["moved"] = memo.get("moved") or target.type == "vnpu"
                return target
            if obj.type == "cpu":  # e.g. zeros_like(x, device="cpu"): CPU outputs are right on vnpu too
                memo["explicit_cpu"] = True
            return obj
        if isinstance(obj, str) and (obj == master or obj.startswith(master + ":")):
            memo["moved"] = memo.get("moved") or target.type == "vnpu"
            return target.type
        if isinstance(obj, str) and obj == "cpu":
            memo["explicit_cpu"] = True
        if isinstance(obj, torch.Size):
            return obj
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*[self.convert(x, target, master, keep_grad, memo) for x in obj])
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.convert(x, target, master, keep_grad, memo) for x in obj)
        if isinstance(obj, dict):
            return {k: self.convert(v, target, master, keep_grad, memo) for k, v in obj.items()}
        return obj

    def convert_sample(self, ms, target, keep_grad=False):
        """(input, args, kwargs) of the (master device type, SampleInput) pair ms, for a run on target."""
        master, s = ms
        memo = {}
        inp = self.convert(s.input, target, master, keep_grad, memo)
        args = self.convert(tuple(s.args), target, master, keep_grad, memo)
        kwargs = self.convert(dict(s.kwargs), target, master, keep_grad, memo)
        # outputs must be on vnpu if anything was, unless the sample asks for cpu explicitly
        self.moved = bool(memo.get("moved", False)) and not memo.get("explicit_cpu", False)
        return inp, args, kwargs

    def layout_sample(self, ms, layout):
        """The (master, SampleInput) pair ms with every tensor in `layout` (see layout_tensor), or None if
        no tensor of the sample changed."""
        master, s = ms
        changed = []

        def f(t):
            r = layout_tensor(t, layout) if isinstance(t, self.torch.Tensor) else t
            if r is not t:
                changed.append(True)
            return r

        ts = s.transform(f)
        if not changed:
            return None
        if master == "vnpu":
            self.sync()
        return (master, ts)

    def cpu_layout_bug(self, call, sample, result, tol, keep_grad=False):
        """For a layout variant: a message if CPU's `result` of call(inputs) differs from CPU's result on
        contiguous copies of the same inputs (then CPU itself has a layout bug and is no oracle), else None."""
        torch = self.torch
        master, s = sample
        contig = (master, s.transform(lambda t: t.contiguous().requires_grad_(t.requires_grad)
                                      if isinstance(t, torch.Tensor) and t.layout == torch.strided else t))
        try:
            expected = call(self.convert_sample(contig, torch.device("cpu"), keep_grad=keep_grad))
        except CaseTimeout:
            raise
        except Exception as e:
            return f"CPU raised on contiguous copies of the inputs ({_exc_msg(e)}) but not on this layout"
        err = self.compare_values(expected, result, tol, False, "out", require_vnpu=False, check_strides=False)
        self._notes = []
        return None if err is None else ("CPU's result for this layout differs from its result for contiguous "
                                         f"copies of the same inputs (a CPU kernel bug): {err}")

    def gen_samples(self, op, dtype, requires_grad, which, start=0, stop=None):
        """[(master, SampleInput)] generated on vnpu (as PyTorch's device tests do on CUDA: tensors the
        OpInfo creates without a device stay on CPU); on CPU (then moved) if generation on vnpu fails."""
        torch = self.torch
        err = None
        for dev in ("vnpu", "cpu"):
            try:
                torch.manual_seed(0)
                fn = op.sample_inputs if which == "sample" else op.reference_inputs
                out = [(dev, s) for s in itertools.islice(fn(dev, dtype, requires_grad=requires_grad), start, stop)]
                if dev == "vnpu":
                    self.sync()
                return out, err
            except CaseTimeout:
                raise
            except Exception as e:
                self.drain()
                if err is None:
                    err = f"sample generation on vnpu failed ({_exc_msg(e)}); generated on cpu"
                else:
                    raise
        return [], err

    # ---------------------------------------------------------------- comparison helpers
    def flatten(self, obj, path="out"):
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            yield path, obj
        elif isinstance(obj, torch.Size):
            yield path, tuple(obj)
        elif isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                yield from self.flatten(x, f"{path}[{i}]")
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                yield from self.flatten(obj[k], f"{path}[{k!r}]")
        else:
            yield path, obj

    def tolerances(self, op, dtype):
        """(atol, rtol) from the OpInfo's toleranceOverride decorators for dtype (max over them)."""
        from torch.testing._internal.common_device_type import toleranceOverride
        from torch.testing._internal.opinfo.core import DecorateInfo

        atol = rtol = 0.0
        found = False
        for d in getattr(op, "decorators", ()) or ():
            decs, ok = [d], True
            if isinstance(d, DecorateInfo):
                ok = d.device_type in (None, "cpu") and (d.dtypes is None or dtype in d.dtypes)
                decs = list(d.decorators)
            if not ok:
                continue
            for dec in decs:
                if isinstance(dec, toleranceOverride) and dtype in dec.d:
                    t = dec.d[dtype]
                    atol, rtol, found = max(atol, t.atol), max(rtol, t.rtol), True
        return (atol, rtol) if found else None

    def compare_values(self, expected, actual, tol, meta_only, what="out", require_vnpu=True, tensors_only=False,
                       check_strides=True):
        """None if actual (vnpu) matches expected (cpu), else a failure message."""
        torch = self.torch
        from torch.testing._comparison import default_tolerances

        e_leaves = list(self.flatten(expected, what))
        a_leaves = list(self.flatten(actual, what))
        if tensors_only:
            e_leaves = [(p, x) for p, x in e_leaves if isinstance(x, torch.Tensor)]
            a_leaves = [(p, x) for p, x in a_leaves if isinstance(x, torch.Tensor)]
        if [p for p, _ in e_leaves] != [p for p, _ in a_leaves]:
            return (f"structure mismatch: cpu {[p for p, _ in e_leaves][:6]} vs vnpu "
                    f"{[p for p, _ in a_leaves][:6]} ({type(expected).__name__} vs {type(actual).__name__})")
        notes = []
        for (path, e), (_, a) in zip(e_leaves, a_leaves):
            if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
                return f"type mismatch at {path}: cpu {type(e).__name__} vs vnpu {type(a).__name__}"
            if isinstance(e, torch.Tensor):
                if require_vnpu and e.device.type == "cpu" and a.device.type != "vnpu":
                    return f"device mismatch at {path}: vnpu output on {a.device}"
                if e.dtype != a.dtype:
                    return f"dtype mismatch at {path}: cpu {e.dtype} vs vnpu {a.dtype}"
                if e.shape != a.shape:
                    return f"shape mismatch at {path}: cpu {tuple(e.shape)} vs vnpu {tuple(a.shape)}"
                if e.layout != a.layout:
                    return f"layout mismatch at {path}: cpu {e.layout} vs vnpu {a.layout}"
                if e.layout == torch.strided and e.numel() > 1:
                    exact = self.opts.get("exact_strides", False)  # size-1 dims' strides too
                    es = [st for s, st in zip(e.shape, e.stride()) if s > 1 or exact]
                    as_ = [st for s, st in zip(a.shape, a.stride()) if s > 1 or exact]
                    if es != as_:
                        msg = f"stride {path}: cpu {tuple(e.stride())} vnpu {tuple(a.stride())}"
                        if check_strides and self.opts.get("stride_check", True):
                            return "stride mismatch: " + msg
                        notes.append(msg)
                if meta_only:
                    continue
                ac = a.detach().to("cpu")
                ec = e.detach()
                if ec.layout != torch.strided:
                    ec, ac = ec.to_dense(), ac.to_dense()
                ec, ac = ec.resolve_conj().resolve_neg(), ac.resolve_conj().resolve_neg()
                atol, rtol = default_tolerances(ec.dtype)
                if tol is not None:
                    atol, rtol = max(atol, tol[0]), max(rtol, tol[1])
                try:
                    torch.testing.assert_close(ac, ec, atol=atol, rtol=rtol, equal_nan=True,
                                               check_device=False, check_stride=False)
                except AssertionError as err:
                    return f"value mismatch at {path}: {_short(err, 400)}"
            else:
                if meta_only:
                    continue
                if isinstance(e, (bool, int, float, complex)) and isinstance(a, (bool, int, float, complex)):
                    if type(e) is not type(a):
                        return f"scalar type mismatch at {path}: cpu {type(e).__name__} vs vnpu {type(a).__name__}"
                    if isinstance(e, (float, complex)):
                        try:
                            torch.testing.assert_close(a, e, equal_nan=True,
                                                       **({} if tol is None else {"atol": tol[0], "rtol": tol[1]}))
                        except AssertionError as err:
                            return f"value mismatch at {path}: {_short(err, 300)}"
                    elif e != a:
                        return f"value mismatch at {path}: cpu {e!r} vs vnpu {a!r}"
                elif isinstance(e, torch.device) or isinstance(a, torch.device):
                    continue
                else:
                    try:
                        same = bool(e == a)
                    except Exception:
                        same = repr(e) == repr(a)
                    if not same:
                        return f"value mismatch at {path}: cpu {_short(repr(e), 80)} vs vnpu {_short(repr(a), 80)}"
        self._notes = notes
        return None

    def storage_ids(self, obj):
        """data_ptr of the storage of every non-empty tensor leaf, in flatten order (None for others)."""
        torch = self.torch
        out = []
        for _, t in self.flatten(obj):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel() > 0:
                try:
                    out.append(t.untyped_storage().data_ptr())
                except Exception:
                    out.append(None)
            else:
                out.append(None)
        return out

    def alias_pattern(self, inputs, outputs):
        """For every output leaf, the index of the input leaf whose storage it shares (or -1)."""
        ins = self.storage_ids(inputs)
        res = []
        for p in self.storage_ids(outputs):
            res.append(ins.index(p) if (p is not None and p in ins) else -1)
        return res

    def is_random(self, op, ms):
        """Whether the op draws random numbers for sample ms: a separate CPU call under a dispatch mode
        (not the compared call: a TorchDispatchMode changes the behaviour of some composite out= ops)."""
        k = id(ms)
        if k not in self.random_cache:
            probe = self.SeededOpProbe()
            try:
                c = self.convert_sample(ms, self.torch.device("cpu"))
                with probe:
                    op(c[0], *c[1], **c[2])
            except CaseTimeout:
                raise
            except Exception:
                pass
            self.random_cache[k] = probe.random
        return self.random_cache[k]

    # ---------------------------------------------------------------- case runner
    def run_case(self, rec, fn):
        self.case_no = getattr(self, "case_no", 0) + 1
        if self.case_no <= getattr(self, "skip", 0):
            return
        rec.setdefault("notes", [])
        rec["seq"] = self.case_no
        self.on_start(rec)
        self.set_phase("cpu")
        self._notes = []
        t0 = time.time()
        status = msg = None
        timed_out = False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with _Alarm(self.timeout):
                    status, msg = fn(rec)
        except CaseTimeout:
            if self.phase == "cpu":
                status, msg = "cpu_failed", f"timeout: the CPU reference did not finish in {self.timeout}s"
            else:
                status, msg = "failed", f"timeout: case did not finish in {self.timeout}s"
            timed_out = True
        except Exception as e:  # a bug of the harness; still report the case
            status, msg = "failed", f"harness error: {_exc_msg(e)} @ {traceback.format_exc(limit=-2)!r}"[:MSG_LEN]
        clean = self.drain()
        rec["status"], rec["msg"] = status, (msg or "")
        rec["notes"] = rec["notes"] + self._notes
        rec["secs"] = round(time.time() - t0, 3)
        self.emit(rec)
        if timed_out or not clean:
            raise WorkerMustExit(f"device not clean after {rec['op']} {rec['dtype']} {rec['kind']}")

    # ---------------------------------------------------------------- forward
    def forward_case(self, op, variant, sample, tol, meta_only_op, layout=None):
        torch = self.torch

        def fn(rec):
            if variant == "fn":
                f = op
            elif variant == "inplace":
                f = op.inplace_variant
            else:
                f = op
            cpu_in = self.convert_sample(sample, torch.device("cpu"))
            if (variant == "inplace" and isinstance(cpu_in[0], torch.Tensor)
                    and cpu_in[0].layout == torch.strided and torch._debug_has_internal_overlap(cpu_in[0]) == 2
                    and _overlaps_itself(cpu_in[0])):
                # ATen raises for stride-0 overlap (CPU and vnpu must both raise: compared as usual); other
                # self-overlapping strides give a result that depends on the kernel's iteration order, and CPU
                # may not even finish (polygamma_ loops for minutes)
                return "skipped", "in-place on an input whose elements overlap in memory (undefined result)"
            cpu_exc = None
            det = self.RandomDetector()
            out_cpu = None
            try:
                if variant == "out":
                    with det:
                        expected = op(cpu_in[0], *cpu_in[1], **cpu_in[2])
                    e_leaves = list(self.flatten(expected))
                    if not e_leaves or not all(isinstance(t, torch.Tensor) for _, t in e_leaves):
                        return "skip-silent", None
                    # fresh inputs for the out= call, out tensors with CPU's expected metadata
                    cpu_in = self.convert_sample(sample, torch.device("cpu"))
                    out_cpu = torch.utils._pytree.tree_map_only(
                        torch.Tensor, lambda t: _padded(layout_tensor(torch.zeros_like(t).detach(), layout, out=True))
                        if layout else torch.empty_like(t).detach(), expected)
                    if isinstance(out_cpu, list):
                        out_cpu = tuple(out_cpu)
                    with det:
                        r_cpu = op(cpu_in[0], *cpu_in[1], **cpu_in[2], out=out_cpu)
                    if layout and not det.random and not self.is_random(op, sample):
                        # CPU's out= kernels mishandle some layouts (tril/triu on batches write garbage, or past
                        # the end of out: hence the padding; linalg_lu's L; narrow_copy and avg_pool3d into
                        # slices): there the oracle is the functional result in CPU's out tensors, and the
                        # inputs as the functional call leaves them (Note [out= tensors in other layouts]).
                        pairs = [(o, e) for (_, o), (_, e) in zip(self.flatten(out_cpu), e_leaves)
                                 if isinstance(o, torch.Tensor) and o.shape == e.shape and o.dtype == e.dtype]
                        if any(not torch.equal(o, e) and not (o.is_floating_point() and torch.allclose(
                                o, e, equal_nan=True, **(dict(atol=tol[0], rtol=tol[1]) if tol else {})))
                               for o, e in pairs):
                            for o, e in pairs:
                                o.copy_(e)
                            cpu_in = self.convert_sample(sample, torch.device("cpu"))
                            op(cpu_in[0], *cpu_in[1], **cpu_in[2])
                            self._notes.append(f"cpu's out= kernel is wrong for {layout} outs: compared with "
                                               "the functional result")
                else:
                    with det:
                        r_cpu = f(cpu_in[0], *cpu_in[1], **cpu_in[2])
            except CaseTimeout:
                raise
            except Exception as e:
                cpu_exc = e
            meta_only = meta_only_op or det.random or self.is_random(op, sample)
            rec["random"] = bool(meta_only)
            if layout and variant == "fn" and cpu_exc is None and not meta_only:
                bug = self.cpu_layout_bug(lambda c: f(c[0], *c[1], **c[2]), sample, r_cpu, tol)
                if bug:
                    return "cpu_failed", bug

            # vnpu
            self.set_phase("vnpu")
            try:
                vn_in = self.convert_sample(sample, self.dev)
                moved = self.moved
                out_vn = None
                if variant == "out":
                    if out_cpu is None:  # CPU failed before making out tensors
                        out_vn = None
                    else:
                        out_vn = torch.utils._pytree.tree_map_only(
                            torch.Tensor, lambda t: self.copy_tensor(t, self.dev), out_cpu)
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                if cpu_exc is not None:
                    return "cpu_failed", f"cpu raised {_exc_msg(cpu_exc)}"
                return "failed", f"input transfer to vnpu failed: {_exc_msg(e)}"
            vn_exc = None
            try:
                if variant == "out":
                    if out_vn is None:
                        raise RuntimeError("(not run: CPU failed before the out= call)")
                    r_vn = op(vn_in[0], *vn_in[1], **vn_in[2], out=out_vn)
                else:
                    r_vn = f(vn_in[0], *vn_in[1], **vn_in[2])
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                vn_exc = e
            if cpu_exc is not None:
                note = "vnpu raised too" if vn_exc is not None else "vnpu did NOT raise"
                return "cpu_failed", f"cpu raised {_exc_msg(cpu_exc)} ({note})"
            if vn_exc is not None:
                return "failed", f"vnpu raised {_exc_msg(vn_exc)}"

            # identity of in-place / out= results
            if variant == "inplace":
                if (r_cpu is cpu_in[0]) and (r_vn is not vn_in[0]):
                    return "failed", "inplace: result is not the input tensor (it is on CPU)"
            if variant == "out":
                def ident(r, o):
                    if isinstance(o, torch.Tensor):
                        return r is o
                    return isinstance(r, (tuple, list)) and len(r) == len(o) and all(x is y for x, y in zip(r, o))
                if ident(r_cpu, out_cpu):
                    if not ident(r_vn, out_vn):
                        return "failed", "out=: result is not the out tensor(s) (it is on CPU)"
                    err = self.compare_values(out_cpu, out_vn, tol, meta_only, "out_arg")
                    if err:
                        return "failed", "out=: " + err
            err = self.compare_values(r_cpu, r_vn, tol, meta_only, "out", require_vnpu=moved,
                                      check_strides=op.name not in CUDA_LAYOUT_OPS)
            if err:
                return "failed", err
            notes = list(self._notes)
            # inputs after the call (mutation parity)
            if not meta_only:
                err = self.compare_values(cpu_in, vn_in, tol, False, "inputs", require_vnpu=False,
                                          tensors_only=True)
                if err:
                    return "failed", "inputs after call differ: " + err
            # view aliasing of the functional variant
            if variant == "fn":
                ap_cpu = self.alias_pattern(cpu_in, r_cpu)
                ap_vn = self.alias_pattern(vn_in, r_vn)
                if ap_cpu != ap_vn:
                    return "failed", f"alias mismatch: output->input storage sharing cpu {ap_cpu[:8]} vs vnpu {ap_vn[:8]}"
            self._notes = notes
            return "passed", None

        return fn

    # ---------------------------------------------------------------- grad
    def grad_case(self, op, sample, tol, meta_only_op, layout=None):
        torch = self.torch

        def leaves_of(conv):
            return [t for _, t in self.flatten(conv, "in")
                    if isinstance(t, torch.Tensor) and t.requires_grad]

        def loss_of(outs, weights, device):
            outs = [t for _, t in self.flatten(outs)]
            terms = []
            for i, (o, w) in enumerate(zip(outs, weights)):
                if w is None:
                    continue
                if not isinstance(o, torch.Tensor) or not o.requires_grad:
                    raise RuntimeError(f"vnpu output {i} does not require grad (it does on CPU)")
                oo = torch.view_as_real(o.resolve_conj()) if o.is_complex() else o
                terms.append((oo * w.to(device)).sum())
            return sum(terms)

        def fn(rec):
            call = lambda s: s[3](op.gradcheck_wrapper(op.get_op(), s[0], *s[1], **s[2]))
            c = self.convert_sample(sample, torch.device("cpu"), keep_grad=True) + (sample[1].output_process_fn_grad,)
            leaves_c = leaves_of(c[:3])
            if not leaves_c:
                return "skip-silent", None
            det = self.RandomDetector()
            try:
                with det:
                    out_c = call(c)
                    outs = [t for _, t in self.flatten(out_c)]
                    g = torch.Generator().manual_seed(1234)
                    weights = []
                    for o in outs:
                        if (isinstance(o, torch.Tensor) and o.requires_grad
                                and (o.is_floating_point() or o.is_complex())):
                            shape = tuple(o.shape) + ((2,) if o.is_complex() else ())
                            rd = o.real.dtype if o.is_complex() else o.dtype
                            weights.append(torch.rand(shape, generator=g, dtype=torch.float64).to(rd))
                        else:
                            weights.append(None)
                    if all(w is None for w in weights):
                        return "skip-silent", None
                    loss_c = loss_of(out_c, weights, torch.device("cpu"))
                    grads_c = torch.autograd.grad(loss_c, leaves_c, allow_unused=True)
            except CaseTimeout:
                raise
            except Exception as e:
                return "cpu_failed", f"cpu raised {_exc_msg(e)}"
            meta_only = meta_only_op or det.random or self.is_random(op, sample)
            rec["random"] = bool(meta_only)
            if layout and not meta_only:
                def fwd_and_grads(c):
                    cc = c + (sample[1].output_process_fn_grad,)
                    out = call(cc)
                    return out, torch.autograd.grad(loss_of(out, weights, torch.device("cpu")), leaves_of(cc[:3]),
                                                    allow_unused=True)
                bug = self.cpu_layout_bug(fwd_and_grads, sample, (out_c, grads_c), tol, keep_grad=True)
                if bug:
                    return "cpu_failed", bug
            self.set_phase("vnpu")
            try:
                v = self.convert_sample(sample, self.dev, keep_grad=True) + (sample[1].output_process_fn_grad,)
                leaves_v = leaves_of(v[:3])
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                return "failed", f"input transfer to vnpu failed: {_exc_msg(e)}"
            try:
                out_v = call(v)
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                return "failed", f"grad: vnpu forward raised {_exc_msg(e)}"
            try:
                loss_v = loss_of(out_v, weights, self.dev)
                grads_v = torch.autograd.grad(loss_v, leaves_v, allow_unused=True)
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                return "failed", f"grad: vnpu backward raised {_exc_msg(e)}"
            err = self.compare_values(out_c, out_v, tol, meta_only, "out", check_strides=op.name not in CUDA_LAYOUT_OPS)
            if err:
                return "failed", "grad: forward " + err
            for i, (gc, gv) in enumerate(zip(grads_c, grads_v)):
                if (gc is None) != (gv is None):
                    return "failed", f"grad: input {i} grad is {'None' if gv is None else 'set'} on vnpu, not on CPU"
                if gc is None:
                    continue
                err = self.compare_values(gc, gv, tol, meta_only, f"grad[{i}]")
                if err:
                    return "failed", "grad: " + err
            return "passed", None

        return fn

    # ---------------------------------------------------------------- error inputs
    def error_case(self, op, ei):
        torch = self.torch

        def fn(rec):
            s = ("cpu", ei.sample_input)  # error inputs are generated on CPU; all their CPU tensors move
            cpu_exc = vn_exc = None
            try:
                c = self.convert_sample(s, torch.device("cpu"))
                op(c[0], *c[1], **c[2])
            except CaseTimeout:
                raise
            except Exception as e:
                cpu_exc = e
            self.set_phase("vnpu")
            try:
                v = self.convert_sample(s, self.dev)
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                if cpu_exc is None:
                    return "cpu_failed", "cpu did not raise"
                return "failed", f"input transfer to vnpu failed: {_exc_msg(e)}"
            late = False
            try:
                op(v[0], *v[1], **v[2])
                late = True  # anything raised from here on surfaced at the synchronization, not at the call
                self.sync()
            except CaseTimeout:
                raise
            except Exception as e:
                vn_exc = e
            if cpu_exc is None:
                return "cpu_failed", ("cpu did not raise (expected "
                                      f"{getattr(ei.error_type, '__name__', ei.error_type)}: {ei.error_regex!r})"
                                      + ("; vnpu raised " + _exc_msg(vn_exc) if vn_exc is not None else ""))
            if vn_exc is None:
                return "failed", f"error: vnpu did not raise (cpu raised {_exc_msg(cpu_exc)})"
            if late:
                if op_key(op) in ASYNC_ON_CUDA or op.name in ASYNC_ON_CUDA:
                    return "passed", None  # CUDA raises it asynchronously too (a device-side assert)
                return "failed", (f"error: vnpu raised only at the next synchronization ({_exc_msg(vn_exc)}); "
                                  f"cpu raised at the call: {_exc_msg(cpu_exc)}")
            if not isinstance(vn_exc, type(cpu_exc)):
                return "failed", (f"error: vnpu raised {_exc_msg(vn_exc)}; cpu raised {_exc_msg(cpu_exc)}")
            return "passed", None

        return fn

    def inplace_broadcast_case(self, op, bad):
        """The in-place variant on a sample whose broadcast shape differs from self's (`bad`), after a valid
        in-place call with the same arguments and a self of the broadcast shape warmed whatever vnpu caches
        per op and input layout: CPU raises "output with shape .. doesn't match the broadcast shape"; vnpu
        must raise the same exception type at the call and leave self as it was (shape and values), never
        resize it."""
        torch = self.torch

        def fn(rec):
            f = op.inplace_variant
            c = self.convert_sample(bad, torch.device("cpu"))
            try:
                f(c[0], *c[1], **c[2])
                return "cpu_failed", "cpu did not raise for an in-place call whose broadcast shape differs from self's"
            except CaseTimeout:
                raise
            except Exception as e:
                cpu_exc = e
            try:
                full = op(c[0], *c[1], **c[2])  # the broadcast shape: a self the in-place call may write
            except CaseTimeout:
                raise
            except Exception:
                full = None
            self.set_phase("vnpu")
            if isinstance(full, torch.Tensor) and full.dtype == c[0].dtype:
                w = self.convert_sample(bad, self.dev)
                try:
                    f(full.to(self.dev), *w[1], **w[2])
                    self.sync()
                except CaseTimeout:
                    raise
                except Exception:
                    self.drain()  # the valid call's own failures are the forward cases' business
            v = self.convert_sample(bad, self.dev)
            self.sync()
            before = v[0].detach().cpu().clone()
            try:
                f(v[0], *v[1], **v[2])
            except CaseTimeout:
                raise
            except Exception as e:
                if not isinstance(e, type(cpu_exc)):
                    return "failed", f"inplace_broadcast: vnpu raised {_exc_msg(e)}; cpu raised {_exc_msg(cpu_exc)}"
            else:
                try:
                    self.sync()
                    return "failed", (f"inplace_broadcast: vnpu did not raise (self {tuple(before.shape)} -> "
                                      f"{tuple(v[0].shape)}); cpu raised {_exc_msg(cpu_exc)}")
                except CaseTimeout:
                    raise
                except Exception as e:
                    return "failed", f"inplace_broadcast: vnpu raised only at the next synchronization ({_exc_msg(e)})"
            self.sync()
            after = v[0].detach().cpu()
            if after.shape != before.shape or not torch.equal(after.nan_to_num(), before.nan_to_num()):
                return "failed", f"inplace_broadcast: vnpu raised but changed self {tuple(before.shape)} -> {tuple(after.shape)}"
            return "passed", None

        return fn

    # ---------------------------------------------------------------- one OpInfo
    def layout_variants(self, key, dn, kind, src, i, s0):
        """(None, s0), then (layout, sample) for every layout of opts["layouts"] that changes s0. The layout
        samples are kept alive for the dtype's loop (is_random caches by id). With opts["layouts_only"] the
        sample as given is not yielded."""
        if not self.opts.get("layouts_only"):
            yield None, s0
        layouts = self.opts.get("layouts") or []
        if self.opts.get("layout_dtypes") and dn not in self.opts["layout_dtypes"]:
            return
        if self.opts.get("layout_limit") is not None and i >= self.opts["layout_limit"]:
            return
        for layout in layouts:
            self.set_phase("vnpu")
            try:
                ls = self.layout_sample(s0, layout)
            except CaseTimeout:
                raise
            except Exception as e:
                self.drain()
                self.emit(dict(op=key, dtype=dn, kind=kind, variant="samplegen", layout=layout, src=src, idx=i,
                               status="failed", msg=f"layout sample failed: {_exc_msg(e)}", notes=[]))
                continue
            if ls is not None:
                self._layout_keep.append(ls)
                yield layout, ls

    def run_op(self, op, skip=0):
        """All cases of op; the first `skip` cases are not run (resuming after a hang or crash)."""
        self.case_no, self.skip = 0, skip
        torch = self.torch
        opts = self.opts
        key = op_key(op)
        limit = opts.get("limit_samples")
        try:
            supported = op.supported_dtypes("cpu")
        except Exception as e:
            supported = set()
            self.emit(dict(op=key, dtype=ERROR_DTYPE, kind="forward", variant="fn", src="meta", idx=0,
                           status="skipped", msg=f"supported_dtypes failed: {_exc_msg(e)}", notes=[]))
        meta_only_op = bool(getattr(op, "has_nondeterministic_output", False)) or op.name in UNINITIALIZED_OUTPUT_OPS
        dtypes = [n for n in opts["dtypes"] if self.dtypes[n] in supported]

        for dn in dtypes:
            dtype = self.dtypes[dn]
            self.random_cache = {}
            self._layout_keep = []
            tol = self.tolerances(op, dtype)
            # ---- forward: sample inputs then reference inputs beyond the sample-input prefix
            samples, refs = [], []
            self.on_start(dict(op=key, dtype=dn, kind="forward", variant="samplegen", src="sample", idx=0))
            self.set_phase("vnpu")
            try:
                samples, gen_err = self.gen_samples(op, dtype, False, "sample", 0, limit)
                if op.reference_inputs_func is not None and not opts.get("no_reference"):
                    torch.manual_seed(0)
                    n_samples = sum(1 for _ in op.sample_inputs("cpu", dtype, requires_grad=False))
                    stop = None if limit is None else n_samples + limit
                    refs, gen_err2 = self.gen_samples(op, dtype, False, "reference", n_samples, stop)
                    gen_err = gen_err or gen_err2
                if gen_err:
                    self.emit(dict(op=key, dtype=dn, kind="forward", variant="samplegen", src="sample", idx=0,
                                   status="failed", msg=gen_err, notes=[]))
            except CaseTimeout:
                raise
            except Exception as e:
                self.emit(dict(op=key, dtype=dn, kind="forward", variant="fn", src="sample", idx=0,
                               status="skipped", msg=f"sample generation failed: {_exc_msg(e)}", notes=[]))
            variants = ["fn"]
            if op.inplace_variant is not None and not opts.get("no_inplace"):
                variants.append("inplace")
            if op.supports_out and not opts.get("no_out"):
                variants.append("out")
            for src, lst in (("sample", samples), ("reference", refs)):
                for i, s0 in enumerate(lst):
                    for layout, s in self.layout_variants(key, dn, "forward", src, i, s0):
                        for variant in variants:
                            rec = dict(op=key, dtype=dn, kind="forward", variant=variant, layout=layout, src=src,
                                       idx=i, sample=_short(getattr(s[1], "name", "") or "", 60))
                            self.run_case(rec, self.forward_case(op, variant, s, tol, meta_only_op, layout))

            # ---- in-place calls whose broadcast shape is not self's, after a valid one (all samples: the
            # broadcasting ones come late in OpInfo's lists)
            if "inplace" in variants and dn in INPLACE_BROADCAST_DTYPES:
                try:
                    torch.manual_seed(0)
                    every = [("vnpu", x) for x in op.sample_inputs("vnpu", dtype, requires_grad=False)]
                    self.sync()
                except CaseTimeout:
                    raise
                except Exception:
                    self.drain()
                    every = []
                for i, bad in enumerate(x for x in every if x[1].broadcasts_input):
                    rec = dict(op=key, dtype=dn, kind="forward", variant="inplace_broadcast", layout=None,
                               src="sample", idx=i, sample=_short(getattr(bad[1], "name", "") or "", 60))
                    self.run_case(rec, self.inplace_broadcast_case(op, bad))

            # ---- gradients
            if (not opts.get("no_grad") and dn in GRAD_DTYPES and op.supports_autograd
                    and dtype in op.supported_backward_dtypes("cpu")):
                gsamples = []
                self.on_start(dict(op=key, dtype=dn, kind="grad", variant="samplegen", src="sample", idx=0))
                self.set_phase("vnpu")
                try:
                    gsamples, gen_err = self.gen_samples(op, dtype, True, "sample", 0, limit)
                    if gen_err:
                        self.emit(dict(op=key, dtype=dn, kind="grad", variant="samplegen", src="sample", idx=0,
                                       status="failed", msg=gen_err, notes=[]))
                except CaseTimeout:
                    raise
                except Exception as e:
                    self.emit(dict(op=key, dtype=dn, kind="grad", variant="", src="sample", idx=0,
                                   status="skipped", msg=f"sample generation failed: {_exc_msg(e)}", notes=[]))
                for i, s0 in enumerate(gsamples):
                    for layout, s in self.layout_variants(key, dn, "grad", "sample", i, s0):
                        rec = dict(op=key, dtype=dn, kind="grad", variant="", layout=layout, src="sample", idx=i,
                                   sample=_short(getattr(s[1], "name", "") or "", 60))
                        self.run_case(rec, self.grad_case(op, s, tol, meta_only_op, layout))

        # ---- error inputs (once per op; they bring their own dtypes)
        if not opts.get("no_errors") and op.error_inputs_func is not None:
            try:
                torch.manual_seed(0)
                eis = list(itertools.islice(op.error_inputs("cpu"), opts.get("limit_errors")))
            except Exception as e:
                self.emit(dict(op=key, dtype=ERROR_DTYPE, kind="error", variant="", src="error", idx=0,
                               status="skipped", msg=f"error input generation failed: {_exc_msg(e)}", notes=[]))
                eis = []
            for i, ei in enumerate(eis):
                rec = dict(op=key, dtype=ERROR_DTYPE, kind="error", variant="", src="error", idx=i,
                           sample=_short(getattr(ei.error_type, "__name__", "") + " " + str(ei.error_regex), 60))
                self.run_case(rec, self.error_case(op, ei))


class WorkerMustExit(Exception):
    """The device may hold a hung or poisoned stream: let the parent start a fresh worker."""


# --------------------------------------------------------------------------------------------------
# failure categories (root-cause patterns of failure messages)
# --------------------------------------------------------------------------------------------------

FAILURE_CATEGORIES = [
    # (category, regex on the failure message), first match wins
    # Sparse ops run ATen's SparseCPU/SparseCsrCPU kernels (csrc/ops/Sparse.cpp); what remains unsupported is
    # an op without such a kernel (CPU raises the same) or a layout vnpu does not have.
    ("sparse op without a sparse CPU kernel / unsupported layout on vnpu",
     r"with arguments from the 'Sparse(Csr)?(CPU|vnpu)' backend|vnpu: (tensors|results) of layout"),
    ("sparse tensor reached the dense executor", r"Cannot access storage of Sparse"),
    ("timeout / worker crash", r"^timeout|worker died|hang: no progress"),
    ("Meta-inferred output dtype differs from the CPU kernel's (out= kernel rejects the output)",
     r"Expected out tensor to have dtype|expected scalar type \w+ but found"),
    ("Meta-inferred output size differs from the CPU kernel's",
     r"must match the size of tensor b|shape mismatch at"),
    ("output strides differ from CPU's (memory layout of a result or of an out= argument)", r"stride mismatch"),
    ("CompositeExplicitAutograd kernel reaches a DispatchStub for vnpu",
     r"DispatchStub: missing kernel for vnpu"),
    ("CompositeExplicitAutograd kernel rejects the vnpu device type", r"only supports CPU, CUDA"),
    ("out= overlap check not raised (out re-laid-out/cloned before the CPU kernel)",
     r"vnpu did not raise \(cpu raised RuntimeError: unsupported operation"),
    ("error: vnpu did not raise", r"^error: vnpu did not raise"),
    ("error: different exception type (raised by the Meta kernel, not the CPU kernel)", r"^error: vnpu raised"),
    ("sample generation on vnpu failed", r"^sample generation on vnpu failed"),
    ("input transfer to vnpu failed", r"^input transfer"),
    ("alias mismatch (view vs copy)", r"^alias mismatch"),
    ("in-place/out= result identity", r"result is not the"),
    ("inputs mutated differently", r"^inputs after call differ"),
    ("device of output", r"device mismatch"),
    ("dtype of output", r"dtype mismatch"),
    ("values differ", r"value mismatch"),
    ("vnpu raised (CPU did not)", r"vnpu (forward |backward )?raised"),
    ("harness error", r"^harness error"),
]

# Root causes found by looking at individual cases (op name -> category), where the message alone
# (e.g. "value mismatch") does not tell.
OP_CATEGORIES = {
    "linalg.lu_solve": "out= kernel changes the out tensor's metadata on the CPU alias (conj bit/strides), "
                       "not propagated to the vnpu output",
    "nn.functional.max_unpool2d.grad": "out= kernel changes the out tensor's metadata on the CPU alias "
                                       "(conj bit/strides), not propagated to the vnpu output",
    "nn.functional.max_unpool2d": "out= kernel changes the out tensor's metadata on the CPU alias "
                                  "(conj bit/strides), not propagated to the vnpu output",
    "nn.functional.linear_cross_entropy.chunked": "upstream: torch picks acc_dtype by device type "
                                                  "(cpu: float32, unknown devices: none)",
    "nn.functional.linear_cross_entropy.chunked_none": "upstream: torch picks acc_dtype by device type "
                                                       "(cpu: float32, unknown devices: none)",
}


def failure_category(msg, op=None):
    import re

    msg = msg or ""
    for name, rx in FAILURE_CATEGORIES[:2]:
        if re.search(rx, msg):
            return name
    if op in OP_CATEGORIES and "value mismatch" in msg:
        return OP_CATEGORIES[op]
    for name, rx in FAILURE_CATEGORIES[2:]:
        if re.search(rx, msg):
            return name
    return "other: " + re.sub(r"\d+", "N", msg)[:80]


# --------------------------------------------------------------------------------------------------
# aggregation
# --------------------------------------------------------------------------------------------------

class Aggregator:
    def __init__(self):
        self.total = collections.Counter()
        self.by_dtype = collections.defaultdict(collections.Counter)
        self.by_kind = collections.defaultdict(collections.Counter)
        self.by_variant = collections.defaultdict(collections.Counter)
        self.ops = {}
        self.failing = {}  # (op, dtype, kind label) -> first message
        self.fallback = {}  # worker instance -> snapshot
        self.extra = {}

    def _op(self, name):
        if name not in self.ops:
            self.ops[name] = dict(cases=0, passed=0, failed=0, skipped=0, cpu_failed=0, random_cases=0,
                                  stride_notes=0, first_failure=None, failures=[], failing=[],
                                  skipped_reasons={}, cpu_failed_examples=[], incomplete=None, secs=0.0)
        return self.ops[name]

    def add(self, rec):
        st = rec["status"]
        if st == "skip-silent":
            return
        label = case_kind_label(rec["kind"], rec.get("variant"), rec.get("layout"))
        for c in (self.total, self.by_dtype[rec["dtype"]], self.by_kind[rec["kind"]], self.by_variant[label]):
            c["cases"] += 1
            c[st] += 1
        o = self._op(rec["op"])
        o["cases"] += 1
        o[st] += 1
        o["secs"] = round(o["secs"] + rec.get("secs", 0.0), 3)
        if rec.get("random"):
            o["random_cases"] += 1
        if any(n.startswith("stride") for n in rec.get("notes", [])):
            o["stride_notes"] += 1
            if len(o.setdefault("stride_examples", [])) < 2:
                o["stride_examples"].append(f"{rec['dtype']} {label}: " + rec["notes"][0])
        short = {k: rec.get(k) for k in ("dtype", "kind", "variant", "layout", "src", "idx", "sample", "msg")}
        if st == "failed":
            if o["first_failure"] is None:
                o["first_failure"] = short
            if len(o["failures"]) < 12:
                o["failures"].append(short)
            k = (rec["op"], rec["dtype"], label)
            if k not in self.failing:
                self.failing[k] = rec["msg"]
                o["failing"].append(f"{rec['dtype']} {label}")
        elif st == "skipped":
            r = _short(rec["msg"], 200)
            o["skipped_reasons"][r] = o["skipped_reasons"].get(r, 0) + 1
        elif st == "cpu_failed" and len(o["cpu_failed_examples"]) < 3:
            o["cpu_failed_examples"].append(short)

    def categories(self):
        """{category: {"cases": failing (op, dtype, kind) cases, "ops": [op, ...], "example": msg}}"""
        cats = {}
        for (o, d, k), m in sorted(self.failing.items()):
            c = cats.setdefault(failure_category(m, o), {"cases": 0, "ops": [], "example": _short(m, 300)})
            c["cases"] += 1
            if o not in c["ops"]:
                c["ops"].append(o)
        return dict(sorted(cats.items(), key=lambda kv: -kv[1]["cases"]))

    def merged_stats(self):
        fb, ex = {}, {}
        for snap in self.fallback.values():
            for k, v in snap.items():
                d = fb.setdefault(k, {"reason": v.get("reason", ""), "count": 0})
                d["count"] += int(v.get("count", 0))
        for snap in self.extra.values():
            for k, v in snap.items():
                ex[k] = ex.get(k, 0) + int(v)
        return dict(sorted(fb.items())), dict(sorted(ex.items()))

    def result(self, meta):
        def counts(c):
            return {k: int(c.get(k, 0)) for k in ["cases"] + STATUSES}

        fb, ex = self.merged_stats()
        return {
            "meta": meta,
            "totals": counts(self.total),
            "by_dtype": {d: counts(self.by_dtype[d]) for d in DTYPE_NAMES + [ERROR_DTYPE] if d in self.by_dtype},
            "by_kind": {k: counts(self.by_kind[k]) for k in KINDS if k in self.by_kind},
            "by_kind_variant": {k: counts(v) for k, v in sorted(self.by_variant.items())},
            "ops": dict(sorted(self.ops.items())),
            "failing_cases": [[o, d, k, _short(m, 300)] for (o, d, k), m in sorted(self.failing.items())],
            "failure_categories": self.categories(),
            "fallback_ops": fb,
            "extra_copy_ops": ex,
        }


# --------------------------------------------------------------------------------------------------
# workers
# --------------------------------------------------------------------------------------------------

def _stats():
    import torch
    try:
        return torch.vnpu.get_fallback_ops(), torch.vnpu.get_extra_copy_ops()
    except Exception:
        return {}, {}


_WORKER_BOOT = "import torch\nimport importlib\nimportlib.import_module(mod)._worker_main(conn, opts, phase)\n"


def _worker_main(conn, opts, phase=None):
    """Worker process: asks the parent for op indices until it gets None."""
    if opts.get("threads"):
        os.environ.setdefault("OMP_NUM_THREADS", str(opts["threads"]))
    if opts.get("quiet"):  # C++ warnings of kernels on stream workers go straight to stderr
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)
    warnings.simplefilter("ignore")
    import torch

    if opts.get("threads"):
        torch.set_num_threads(int(opts["threads"]))
    from torch.testing._internal.common_methods_invocations import op_db

    def on_phase(p):
        if phase is not None:
            phase.value = 1 if p == "cpu" else 2

    runner = OpRunner(opts, emit=lambda rec: conn.send(("case", rec)), on_phase=on_phase,
                      on_start=lambda rec: conn.send(("start", {k: rec.get(k) for k in
                                                                ("op", "dtype", "kind", "variant", "layout", "src",
                                                                 "idx", "seq")})))
    while True:
        conn.send(("ready", None))
        msg = conn.recv()
        if msg is None:
            break
        idx, skip = msg
        try:
            runner.run_op(op_db[idx], skip=skip)
        except WorkerMustExit as e:
            conn.send(("stats", _stats()))
            conn.send(("exit", (str(e), runner.case_no)))
            conn.close()
            os._exit(3)
        except Exception as e:  # never lose the worker to a harness bug
            conn.send(("case", dict(op=op_key(op_db[idx]), dtype=ERROR_DTYPE, kind="forward", variant="fn",
                                    src="harness", idx=0, status="failed", notes=[],
                                    msg=f"harness error: {_exc_msg(e)}")))
        conn.send(("done", idx))
        conn.send(("stats", _stats()))
    conn.send(("stats", _stats()))
    conn.close()


def run_sweep(opts, log=lambda *a: print(*a, flush=True)):
    """Runs the sweep described by opts (a dict, see main()) and returns the result dict."""
    t_start = time.time()
    warnings.simplefilter("ignore")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    indices = select_ops(op_db, opts.get("ops"))
    if opts.get("ops_shard"):
        k, n = opts["ops_shard"]
        indices = indices[k::n]
    agg = Aggregator()
    names = {i: op_key(op_db[i]) for i in indices}
    log(f"opinfo sweep: {len(indices)} OpInfos, dtypes {','.join(opts['dtypes'])}, jobs {opts['jobs']}")
    max_secs = (opts.get("max_minutes") or 0) * 60
    completed, not_run, crashed = [], [], []
    last_write = [time.time()]

    def meta():
        return {
            "torch": torch.__version__,
            "dtypes": opts["dtypes"],
            "flags": {k: v for k, v in opts.items() if k not in ("dtypes",)},
            "ops_selected": len(indices),
            "ops_completed": len(completed),
            "ops_not_run": sorted(not_run),
            "ops_crashed_or_hung": crashed,
            "duration_s": round(time.time() - t_start, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
        }

    def maybe_write(force=False):
        if opts.get("json") and (force or time.time() - last_write[0] > 60):
            _write_json(agg.result(meta()), opts["json"])
            last_write[0] = time.time()

    if opts["jobs"] == 0:  # in-process (debugging): no crash/hang protection beyond the alarm
        runner = OpRunner(opts, emit=agg.add)
        for n, i in enumerate(indices):
            if max_secs and time.time() - t_start > max_secs:
                not_run.extend(names[j] for j in indices[n:])
                break
            try:
                runner.run_op(op_db[i])
            except WorkerMustExit as e:
                log(f"  {names[i]}: {e}")
            completed.append(names[i])
            fb, ex = _stats()
            agg.fallback[0], agg.extra[0] = fb, ex
            maybe_write()
        res = agg.result(meta())
        if opts.get("json"):
            _write_json(res, opts["json"])
        return res

    ctx = multiprocessing.get_context("spawn")
    pending = collections.deque((i, 0) for i in indices)  # (op index, cases to skip when resuming)
    resumes = collections.Counter()
    workers = {}  # wid -> dict(proc, conn, op, case, last)
    next_wid = [0]
    hard_timeout = max(opts.get("timeout", 60) * 2, opts.get("timeout", 60) + 60)
    respawns = [0]
    startup_failures = [0]

    def spawn():
        parent, child = ctx.Pipe(duplex=True)
        # exec(bootstrap) rather than target=_worker_main: unpickling a function of torch_vnpu.testing would
        # import torch_vnpu before torch in the child, and `import torch_vnpu` first fails (circular autoload)
        phase = ctx.Value("i", 0, lock=False)  # 1: CPU reference running, 2: vnpu part (for hang attribution)
        p = ctx.Process(target=exec, args=(_WORKER_BOOT, {"mod": __name__, "conn": child, "opts": opts,
                                                          "phase": phase}), daemon=True)
        p.start()
        child.close()
        wid = next_wid[0]
        next_wid[0] += 1
        workers[wid] = dict(proc=p, conn=parent, op=None, case=None, last=time.time(), started=time.time(),
                            alive_msg=False, phase=phase)

    def resume_or_finish(w, why, seq):
        """After a hang/crash/timeout in case number seq of w's op: go on with the next case in a fresh
        worker (at most 5 times per op), else count the op as completed but incomplete."""
        i, name = w["op"], names[w["op"]]
        if seq and resumes[i] < 5:
            resumes[i] += 1
            pending.appendleft((i, seq))
            log(f"  .. {name}: resuming after case {seq} in a fresh worker")
        else:
            agg._op(name)["incomplete"] = why
            completed.append(name)

    def fail_current(w, why):
        if w["op"] is None:
            return
        name = names[w["op"]]
        c = w["case"] or {"op": name, "dtype": ERROR_DTYPE, "kind": "forward", "variant": "fn", "src": "?", "idx": 0}
        in_cpu = w["phase"].value == 1 and c.get("variant") != "samplegen"
        if in_cpu:
            why = why + " in the CPU reference"
        rec = dict(c, status="cpu_failed" if in_cpu else "failed", msg=f"{why} during this case", notes=[])
        agg.add(rec)
        crashed.append(f"{name}: {why} in {c.get('dtype')} {case_kind_label(c.get('kind'), c.get('variant'), c.get('layout'))}"
                       f" {c.get('src')} #{c.get('idx')}")
        log(f"  !! {name}: {why} ({c.get('dtype')} {c.get('kind')} {c.get('variant')} {c.get('src')} #{c.get('idx')})")
        resume_or_finish(w, why, c.get("seq"))

    for _ in range(min(opts["jobs"], max(1, len(pending)))):
        spawn()
    n_done = 0
    try:
        while workers:
            conns = {w["conn"]: wid for wid, w in workers.items()}
            ready = multiprocessing.connection.wait(list(conns), timeout=2.0)
            for c in ready:
                wid = conns[c]
                w = workers[wid]
                try:
                    kind, payload = c.recv()
                except (EOFError, OSError):
                    w["proc"].join(5)
                    code = w["proc"].exitcode
                    if not w["alive_msg"]:
                        startup_failures[0] += 1
                        if startup_failures[0] >= 3:
                            raise RuntimeError(f"opinfo sweep: workers die at startup (exit code {code}); "
                                               "run with --jobs 0 to see why")
                    if w["op"] is not None and code != 3:
                        fail_current(w, f"worker died (exit code {code})")
                    del workers[wid]
                    if pending and respawns[0] < 200:
                        respawns[0] += 1
                        spawn()
                    continue
                w["last"] = time.time()
                w["alive_msg"] = True
                startup_failures[0] = 0
                if kind == "ready":
                    if pending and not (max_secs and time.time() - t_start > max_secs):
                        i, skip = pending.popleft()
                        w["op"], w["case"] = i, None
                        c.send((i, skip))
                    else:
                        c.send(None)
                elif kind == "start":
                    w["case"] = payload
                elif kind == "case":
                    agg.add(payload)
                elif kind == "done":
                    completed.append(names[payload])
                    n_done += 1
                    o = agg.ops.get(names[payload], {})
                    if opts.get("verbose") or o.get("failed"):
                        log(f"  [{n_done}/{len(indices)} {time.time() - t_start:6.0f}s] {names[payload]}: "
                            f"{o.get('passed', 0)}/{o.get('cases', 0)} passed, {o.get('failed', 0)} failed")
                    elif n_done % 25 == 0:
                        log(f"  [{n_done}/{len(indices)} {time.time() - t_start:6.0f}s] "
                            f"{dict((k, agg.total[k]) for k in ['cases'] + STATUSES)}")
                    w["op"], w["case"] = None, None
                    maybe_write()
                elif kind == "stats":
                    agg.fallback[wid], agg.extra[wid] = payload
                elif kind == "exit":
                    # the worker stopped after a timeout/unclean device; the op is incomplete
                    if w["op"] is not None:
                        why, seq = payload
                        name = names[w["op"]]
                        crashed.append(f"{name}: {why}")
                        log(f"  !! {name}: {why}")
                        resume_or_finish(w, why, seq)
                        w["op"] = None
            now = time.time()
            for wid, w in list(workers.items()):
                if w["op"] is not None and now - w["last"] > hard_timeout:
                    w["proc"].kill()
                    w["proc"].join(10)
                    fail_current(w, f"hang: no progress for {hard_timeout}s (worker killed)")
                    w["op"] = None
                    try:
                        w["conn"].close()
                    except Exception:
                        pass
                    del workers[wid]
                    if pending:
                        respawns[0] += 1
                        spawn()
                elif w["op"] is None and not w["proc"].is_alive():
                    try:
                        while w["conn"].poll():
                            kind, payload = w["conn"].recv()
                            if kind == "stats":
                                agg.fallback[wid], agg.extra[wid] = payload
                    except Exception:
                        pass
                    del workers[wid]
                    if pending and not (max_secs and now - t_start > max_secs):
                        spawn()
    finally:
        for w in workers.values():
            if w["proc"].is_alive():
                w["proc"].kill()
    not_run.extend(names[i] for i, _ in pending if names[i] not in completed)
    res = agg.result(meta())
    if opts.get("json"):
        _write_json(res, opts["json"])
    return res


def _write_json(res, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1, default=str)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------

def _pct(c):
    denom = c["cases"] - c["cpu_failed"]
    return f"{c['passed']}/{denom} ({100.0 * c['passed'] / denom:.1f}%)" if denom else "n/a"


def _md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def write_markdown(res, path, command=None):
    t = res["totals"]
    m = res["meta"]
    L = []
    L.append("# Operator coverage: OpInfo parity sweep (vnpu vs CPU)\n")
    L.append("Generated by `scripts/opinfo_parity.py` (`src/torch_vnpu/testing/opinfo.py`): every OpInfo of PyTorch's "
             "`op_db` runs on vnpu and on CPU with the same inputs (same sizes, strides, offsets); outputs, "
             "dtypes, shapes, devices, view aliasing, in-place/`out=` result identity, mutated inputs, input "
             "gradients (float32/float64) and the exception types of `error_inputs` must match. A case that fails "
             "on CPU too is `cpu_failed` and not counted against vnpu. Samples are generated on vnpu as PyTorch's "
             "device tests generate them on CUDA (tensors an OpInfo creates without a device, e.g. index "
             "tensors, stay on CPU). Random ops (the CPU call draws from the CPU generator) and ops with "
             "uninitialized outputs are compared by dtype/shape/device only. Kinds ending in `@<layout>` ran the sample "
             "with its tensors in another memory layout (non-contiguous, transposed, expanded, storage offset, "
             "channels-last: `LAYOUTS`); output strides must equal CPU's; a case where CPU's result for the layout "
             "differs from its result for contiguous copies of the same inputs is `cpu_failed` (a CPU kernel bug).\n")
    fl = m.get("flags", {})
    L.append(f"- torch {m.get('torch')}, {m.get('ops_completed')}/{m.get('ops_selected')} OpInfos completed, "
             f"{fl.get('jobs')} worker(s)"
             + (f", at most {fl.get('limit_samples')} sample + {fl.get('limit_samples')} reference inputs per op and dtype"
                if fl.get("limit_samples") else ", all sample and reference inputs")
             + (f"; layout variants {', '.join(fl['layouts'])}" if fl.get("layouts") else "; no layout variants")
             + (f" of the first {fl['layout_limit']} of each" if fl.get("layout_limit") is not None else ""))
    if command:
        L.append(f"- command: `{command}`")
    if m.get("ops_not_run"):
        L.append(f"- **not run** (time budget): {len(m['ops_not_run'])} OpInfos: "
                 + ", ".join(f"`{x}`" for x in m["ops_not_run"][:40]) + (" …" if len(m["ops_not_run"]) > 40 else ""))
    L.append("")
    L.append(f"## Headline: **{_pct(t)}** cases pass (passed / (cases − cpu_failed))\n")
    L.append("| | cases | passed | failed | skipped | cpu_failed | pass rate |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    L.append(f"| **all** | {t['cases']} | {t['passed']} | {t['failed']} | {t['skipped']} | {t['cpu_failed']} | {_pct(t)} |")
    L.append("")
    L.append("### Per dtype (`any`: error inputs, which bring their own dtypes)\n")
    L.append("| dtype | cases | passed | failed | skipped | cpu_failed | pass rate |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for d, c in res["by_dtype"].items():
        L.append(f"| {d} | {c['cases']} | {c['passed']} | {c['failed']} | {c['skipped']} | {c['cpu_failed']} | {_pct(c)} |")
    L.append("")
    L.append("### Per kind\n")
    L.append("| kind | cases | passed | failed | skipped | cpu_failed | pass rate |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for k, c in res["by_kind_variant"].items():
        L.append(f"| {k} | {c['cases']} | {c['passed']} | {c['failed']} | {c['skipped']} | {c['cpu_failed']} | {_pct(c)} |")
    L.append("")
    cats = res.get("failure_categories") or {}
    if cats:
        L.append("## Failure categories (failing (op, dtype, kind) cases grouped by root-cause pattern)\n")
        L.append("| category | cases | ops | example |")
        L.append("|---|---:|---|---|")
        for c, v in cats.items():
            ops = ", ".join(f"`{o}`" for o in v["ops"][:6]) + (f" (+{len(v['ops']) - 6})" if len(v["ops"]) > 6 else "")
            L.append(f"| {_md_escape(c)} | {v['cases']} | {ops} | {_md_escape(_short(v['example'], 150))} |")
        L.append("")
    failing = [(n, o) for n, o in res["ops"].items() if o["failed"]]
    L.append(f"## Failing ops ({len(failing)} of {len(res['ops'])})\n")
    if failing:
        L.append("| op | failed / cases | failing (dtype kind) | first failure |")
        L.append("|---|---:|---|---|")
        for n, o in failing:
            ff = o["first_failure"] or {}
            where = ", ".join(o["failing"][:6]) + (f" (+{len(o['failing']) - 6})" if len(o["failing"]) > 6 else "")
            msg = f"[{ff.get('dtype')} {case_kind_label(ff.get('kind'), ff.get('variant'), ff.get('layout'))} #{ff.get('idx')}] " \
                  + _short(ff.get("msg", ""), 150)
            L.append(f"| `{n}` | {o['failed']}/{o['cases']} | {_md_escape(where)} | {_md_escape(msg)} |")
    else:
        L.append("None.")
    L.append("")
    skipped = [(n, o) for n, o in res["ops"].items() if o["skipped"]]
    L.append(f"## Skipped ({sum(o['skipped'] for _, o in skipped)} cases in {len(skipped)} ops)\n")
    if skipped:
        L.append("| op | skipped | reasons |")
        L.append("|---|---:|---|")
        for n, o in skipped:
            rs = "; ".join(f"{_short(r, 150)} (×{c})" for r, c in o["skipped_reasons"].items())
            L.append(f"| `{n}` | {o['skipped']} | {_md_escape(rs)} |")
    else:
        L.append("None.")
    L.append("")
    rnd = [n for n, o in res["ops"].items() if o["random_cases"]]
    L.append(f"## Compared by dtype/shape/device only (random or uninitialized outputs): {len(rnd)} ops\n")
    L.append(", ".join(f"`{n}`" for n in rnd) if rnd else "None.")
    L.append("")
    strided = [(n, o) for n, o in res["ops"].items() if o.get("stride_notes")]
    L.append(f"## Output strides differing from CPU (not counted as failures): {len(strided)} ops\n")
    if strided:
        L.append("| op | cases | example |")
        L.append("|---|---:|---|")
        for n, o in strided:
            L.append(f"| `{n}` | {o['stride_notes']} | {_md_escape(_short((o.get('stride_examples') or [''])[0], 150))} |")
    else:
        L.append("None.")
    L.append("")
    L.append("## Ops that took a slower path (`torch.vnpu.get_fallback_ops()`, merged over workers)\n")
    if res["fallback_ops"]:
        L.append("| ATen op | count | reason |")
        L.append("|---|---:|---|")
        for k, v in res["fallback_ops"].items():
            L.append(f"| `{k}` | {v['count']} | {_md_escape(_short(v['reason'], 150))} |")
    else:
        L.append("None.")
    L.append("")
    L.append("## Ops with an extra device copy (`torch.vnpu.get_extra_copy_ops()`, merged over workers)\n")
    if res["extra_copy_ops"]:
        L.append(", ".join(f"`{k}` ({v})" for k, v in res["extra_copy_ops"].items()))
    else:
        L.append("None.")
    L.append("")
    if m.get("ops_crashed_or_hung"):
        L.append("## Worker crashes / hangs\n")
        for x in m["ops_crashed_or_hung"]:
            L.append(f"- {_md_escape(x)}")
        L.append("")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def write_known_failures(res, path):
    """tests/opinfo_known_failures.txt format: `op dtype kind  # category: message`."""
    lines = ["# OpInfo parity cases known to fail on vnpu (tests/test_opinfo_slice.py fails on any other failing case).",
             "# Format: <op> <dtype> <kind>  # <root-cause category>: <first failure message>",
             "# kind: forward, forward:inplace, forward:out, forward:samplegen, grad, grad:samplegen, error",
             f"# Generated from the sweep of {res['meta'].get('started')} "
             "(scripts/opinfo_parity.py --known-failures-out); delete a line when its case passes.", ""]
    for o, d, k, m in res["failing_cases"]:
        lines.append(f"{o} {d} {k}  # {failure_category(m, o)}: {_short(m, 160)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(description="OpInfo parity sweep: vnpu vs CPU over torch's op_db")
    p.add_argument("--ops", action="append", help="comma-separated OpInfo names or glob patterns "
                   "(name or name.variant); repeatable; default: all")
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES), help="comma-separated dtype names")
    p.add_argument("--no-grad", action="store_true", help="skip gradient cases")
    p.add_argument("--no-errors", action="store_true", help="skip error_inputs cases")
    p.add_argument("--no-inplace", action="store_true", help="skip in-place variants")
    p.add_argument("--no-out", action="store_true", help="skip out= variants")
    p.add_argument("--exact-strides", action="store_true",
                   help="compare the strides of size-1 dimensions too (which never address memory)")
    p.add_argument("--no-stride-check", action="store_true",
                   help="report output strides that differ from CPU's as notes instead of failures")
    p.add_argument("--layouts", default=",".join(LAYOUTS),
                   help=f"layout variants of every sample besides the sample as given (comma-separated, from "
                        f"{','.join(LAYOUTS)}; 'none' for none); default: all")
    p.add_argument("--layout-limit", type=int, default=None,
                   help="layout variants of the first N sample inputs and N reference inputs only (per op and dtype)")
    p.add_argument("--layout-dtypes", default=None,
                   help="run the layout variants for these dtypes only (comma-separated); default: every dtype")
    p.add_argument("--json", help="write the result JSON here (rewritten every minute while running)")
    p.add_argument("--markdown", help="write the markdown report here")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (spawn); 0 = in-process, no crash guard")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: 1 when jobs > 1, else torch's default)")
    p.add_argument("--limit-samples", type=int, default=None,
                   help="at most N sample inputs and N reference inputs (and N grad samples) per op and dtype")
    p.add_argument("--limit-errors", type=int, default=None, help="at most N error inputs per op")
    p.add_argument("--timeout", type=int, default=60, help="per-case timeout in seconds (SIGALRM)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop handing out new ops after this many minutes (partial report)")
    p.add_argument("--from-json", help="only render --markdown / --known-failures-out from an existing result JSON")
    p.add_argument("--known-failures-out", help="write the failing (op, dtype, kind) cases, one line each with its "
                   "category, in the format of tests/opinfo_known_failures.txt")
    p.add_argument("--verbose", action="store_true", help="a line per op")
    return p


def opts_from_args(a):
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPE_NAMES]
    if bad:
        raise SystemExit(f"unknown dtypes {bad}; choose from {DTYPE_NAMES}")
    threads = a.threads if a.threads is not None else (1 if a.jobs > 1 else None)
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip() and x.strip() != "none"]
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad:
        raise SystemExit(f"unknown layouts {bad}; choose from {LAYOUTS}")
    layout_dtypes = [d.strip() for d in a.layout_dtypes.split(",") if d.strip()] if a.layout_dtypes else None
    return dict(ops=a.ops, dtypes=dtypes, no_grad=a.no_grad, no_errors=a.no_errors, no_inplace=a.no_inplace,
                no_out=a.no_out, stride_check=not a.no_stride_check, exact_strides=a.exact_strides, layouts=layouts, layout_dtypes=layout_dtypes, layout_limit=a.layout_limit, json=a.json, jobs=a.jobs, threads=threads, limit_samples=a.limit_samples,
                limit_errors=a.limit_errors, timeout=a.timeout, max_minutes=a.max_minutes, verbose=a.verbose)


def main(argv=None):
    a = build_parser().parse_args(argv)
    command = "python scripts/opinfo_parity.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.from_json:
        with open(a.from_json) as f:
            res = json.load(f)
        if a.markdown:
            write_markdown(res, a.markdown, command=res["meta"].get("command"))
        if a.known_failures_out:
            write_known_failures(res, a.known_failures_out)
        return 0
    opts = opts_from_args(a)
    opts["command"] = command
    res = run_sweep(opts)
    res["meta"]["command"] = command
    if a.json:
        _write_json(res, a.json)
    if a.markdown:
        write_markdown(res, a.markdown, command=command)
    if a.known_failures_out:
        write_known_failures(res, a.known_failures_out)
    t = res["totals"]
    print(f"done in {res['meta']['duration_s'] / 60:.1f} min: {t['cases']} cases, {t['passed']} passed, "
          f"{t['failed']} failed, {t['skipped']} skipped, {t['cpu_failed']} cpu_failed  ->  {_pct(t)}")
    for d, c in res["by_dtype"].items():
        print(f"  {d:>10}: {_pct(c)}  failed {c['failed']}")
    for k, c in res["by_kind_variant"].items():
        print(f"  {k:>16}: {_pct(c)}  failed {c['failed']}")
    return 0
