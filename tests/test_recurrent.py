"""nn.LSTM / nn.GRU / LSTMCell / GRUCell on vnpu vs CPU: outputs, final states and every gradient.

ATen calls the fused cell ops (_thnn_fused_lstm_cell, _thnn_fused_gru_cell and their backward ops) for every
non-CPU device; vnpu implements them with the CUDA kernels' semantics (csrc/ops/RecurrentCells.cpp). The fused
formulation sums the gates in another order than CPU's unfused cell, so results agree to float32 rounding
(rtol/atol 1e-5), not bitwise, exactly as CUDA vs CPU.
"""
import copy

import pytest
import torch

TOL = dict(rtol=1e-5, atol=1e-5)


def _grads(module):
    return {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bias,batch_first,bidirectional", [(True, False, False), (False, True, True)])
def test_rnn_modules_match_cpu(kind, bias, batch_first, bidirectional):
    torch.manual_seed(0)
    cpu = getattr(torch.nn, kind)(6, 8, num_layers=2, bias=bias, batch_first=batch_first,
                                   bidirectional=bidirectional)
    dev = copy.deepcopy(cpu).to("vnpu")
    x = torch.randn(3, 5, 6) if batch_first else torch.randn(5, 3, 6)
    xc, xv = x.clone().requires_grad_(), x.to("vnpu").requires_grad_()
    out_c, state_c = cpu(xc)
    out_v, state_v = dev(xv)
    torch.testing.assert_close(out_v.cpu(), out_c, **TOL)
    states_c = state_c if isinstance(state_c, tuple) else (state_c,)
    states_v = state_v if isinstance(state_v, tuple) else (state_v,)
    for sv, sc in zip(states_v, states_c):
        torch.testing.assert_close(sv.cpu(), sc, **TOL)
    # a loss that uses every output, including the final cell state
    (out_c.square().sum() + sum(s.sum() for s in states_c)).backward()
    (out_v.square().sum() + sum(s.sum() for s in states_v)).backward()
    torch.testing.assert_close(xv.grad.cpu(), xc.grad, **TOL)
    gc, gv = _grads(cpu), _grads(dev)
    assert gc.keys() == gv.keys()
    for n in gc:
        assert gv[n].device.type == "vnpu"
        torch.testing.assert_close(gv[n].cpu(), gc[n], **TOL, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_cells_with_given_state_match_cpu(kind):
    torch.manual_seed(1)
    cpu = getattr(torch.nn, kind)(4, 7)
    dev = copy.deepcopy(cpu).to("vnpu")
    x, h = torch.randn(3, 4), torch.randn(3, 7)
    state_c = (h.clone().requires_grad_(), torch.randn(3, 7).requires_grad_()) if kind == "LSTMCell" \
        else h.clone().requires_grad_()
    state_v = tuple(s.detach().to("vnpu").requires_grad_() for s in state_c) if kind == "LSTMCell" \
        else state_c.detach().to("vnpu").requires_grad_()
    out_c, out_v = cpu(x, state_c), dev(x.to("vnpu"), state_v)
    if kind == "LSTMCell":
        # only hy gets a gradient: the fused backward must treat the missing cy gradient as zero
        out_c[0].sum().backward()
        out_v[0].sum().backward()
        for a, b in zip(out_v, out_c):
            torch.testing.assert_close(a.cpu(), b, **TOL)
        for a, b in zip(state_v, state_c):
            torch.testing.assert_close(a.grad.cpu(), b.grad, **TOL)
    else:
        torch.testing.assert_close(out_v.cpu(), out_c, **TOL)
        out_c.pow(2).sum().backward()
        out_v.pow(2).sum().backward()
        torch.testing.assert_close(state_v.grad.cpu(), state_c.grad, **TOL)
    for n, p in cpu.named_parameters():
        torch.testing.assert_close(dict(dev.named_parameters())[n].grad.cpu(), p.grad, **TOL)


def test_lstm_runs_without_host_sync():
    m = torch.nn.LSTM(6, 8).to("vnpu")
    torch.vnpu.reset_op_stats()
    out, _ = m(torch.randn(5, 3, 6, device="vnpu"))
    out.sum().backward()
    torch.vnpu.synchronize()
    assert "aten::_thnn_fused_lstm_cell" not in torch.vnpu.get_fallback_ops()
    assert not torch.vnpu.get_fallback_ops(), torch.vnpu.get_fallback_ops()


@pytest.mark.parametrize("call", [
    lambda v: torch.ops.aten._thnn_fused_lstm_cell(torch.randn(2, 6, device=v), torch.randn(2, 6, device=v),
                                                   torch.randn(2, 2, device=v)),
    lambda v: torch.ops.aten._thnn_fused_lstm_cell(torch.randn(1, 8, device=v), torch.randn(2, 8, device=v),
                                                   torch.randn(2, 2, device=v)),
    lambda v: torch.ops.aten._thnn_fused_lstm_cell(torch.randn(2, 8, device=v), torch.randn(2, 8, device=v),
                                                   torch.randn(2, 2, device=v, dtype=torch.float64)),
    lambda v: torch.ops.aten._thnn_fused_gru_cell(torch.randn(2, 4, device=v), torch.randn(2, 4, device=v),
                                                  torch.randn(2, 1, device=v)),
    lambda v: torch.ops.aten._thnn_fused_gru_cell_backward(torch.randn(2, 2, device=v), torch.randn(2, 8, device=v),
                                                           True),
])
def test_fused_cells_check_their_arguments(call):
    # CUDA's kernels check sizes and dtypes (RNN.cu checkSizes); so does vnpu, with a RuntimeError, not a crash.
    with pytest.raises(RuntimeError):
        call("vnpu")
    assert torch.ones(3, device="vnpu").sum().item() == 3.0
