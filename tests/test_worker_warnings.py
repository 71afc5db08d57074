"""Warnings raised by kernels on the stream worker reach Python's warnings machinery (Note [Worker warnings]).

The kernel used: an explicit `out=` loss kernel that resizes its 0-dim output as scratch, for which CPU's
kernel warns "An output with one or more elements was resized". The second call with the same shapes plans on
the host without warning, so only the worker can raise it.
"""
import warnings

import pytest
import torch

DEV = "vnpu"


def _mse_sum_out(x, y, out):
    return torch._C._nn.mse_loss(x, y, 2, out=out)  # reduction=sum


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 5, generator=g), torch.rand(4, 5, generator=g)


def _warm_up(x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _mse_sum_out(x, y, torch.empty((), device=DEV))
        torch.vnpu.synchronize()


def test_cpu_warns_too():  # the oracle: the same call warns on CPU
    x, y = _inputs()
    with pytest.warns(UserWarning, match="was resized"):
        _mse_sum_out(x, y, torch.empty(()))


@pytest.mark.parametrize("where", ["synchronize", "next_op", "item"])
def test_worker_warning_becomes_python_warning(where):
    x, y = (t.to(DEV) for t in _inputs())
    _warm_up(x, y)
    out = torch.empty((), device=DEV)
    with pytest.warns(UserWarning, match="was resized") as record:
        _mse_sum_out(x, y, out)
        if where == "synchronize":
            torch.vnpu.synchronize()
        elif where == "next_op":
            torch.vnpu.synchronize()  # the kernel has run; its warning is issued at the next vnpu op...
            warnings.simplefilter("always")
            torch.add(x, 1)
        else:
            out.item()
    assert all("was resized" in str(w.message) for w in record)
    torch.testing.assert_close(out.cpu(), torch.nn.functional.mse_loss(x.cpu(), y.cpu(), reduction="sum"))


def test_filters_apply_to_worker_warnings(capfd):
    x, y = (t.to(DEV) for t in _inputs())
    _warm_up(x, y)
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _mse_sum_out(x, y, torch.empty((), device=DEV))
        torch.vnpu.synchronize()
    assert "resized" not in capfd.readouterr().err  # not printed by C++ behind Python's back
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _mse_sum_out(x, y, torch.empty((), device=DEV))
        with pytest.raises(UserWarning, match="was resized"):
            torch.vnpu.synchronize()
    torch.add(x, 1).cpu()  # the device stays usable


def test_failed_out_attempt_does_not_warn():
    # The functional loss first tries its out= kernel, which fails on the scratch resize and falls back
    # to the functional kernel; CPU's functional call does not warn, so neither may vnpu.
    x, y = (t.to(DEV) for t in _inputs())
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = torch.nn.functional.binary_cross_entropy(x, y, reduction="sum")
            torch.vnpu.synchronize()
        torch.testing.assert_close(r.cpu(), torch.nn.functional.binary_cross_entropy(x.cpu(), y.cpu(), reduction="sum"))
