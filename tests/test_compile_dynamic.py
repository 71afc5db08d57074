"""Dynamic shapes under torch.compile on vnpu: automatic dynamic, dynamic=True, mark_dynamic, batch-size
changes, and data-dependent ops (graph break by default; in the graph with Dynamo's capture flags).
Oracle: eager CPU; recompile counts from Dynamo's counters (a new graph per compilation)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

LENGTHS = [8, 16, 24, 32, 40, 48, 56, 64, 100, 130]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _graphs():
    return counters["stats"]["unique_graphs"]


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50)

    def forward(self, idx):
        x = self.ln(self.emb(idx)).unsqueeze(1)
        return self.head(F.scaled_dot_product_attention(x, x, x, is_causal=True).squeeze(1))


def test_ten_sequence_lengths_compile_at_most_twice():
    # (sdpa with a symbolic length: vnpu's backend choice takes the fake tensors as they are)
    torch.manual_seed(0)
    ref = TinyLM()
    mod = TinyLM().to("vnpu")
    mod.load_state_dict(ref.state_dict())
    f = torch.compile(mod)
    for n in LENGTHS:
        idx = torch.randint(0, 50, (2, n))
        torch.testing.assert_close(f(idx.to("vnpu")).cpu(), ref(idx), rtol=1e-4, atol=1e-5)
    assert _graphs() <= 2  # static first, then one graph with a symbolic length


def test_dynamic_true_and_batch_size_changes_compile_once():
    f = torch.compile(lambda x, w: F.gelu(x @ w).sum(-1), dynamic=True)
    w = torch.randn(12, 7)
    for batch, n in [(2, 5), (3, 9), (4, 17), (5, 5)]:  # sizes 0 and 1 are specialized, as on every device
        x = torch.randn(batch, n, 12)
        torch.testing.assert_close(f(x.to("vnpu"), w.to("vnpu")).cpu(), F.gelu(x @ w).sum(-1), rtol=1e-4, atol=1e-5)
    assert _graphs() == 1


def test_mark_dynamic_compiles_once_and_symbolic_sizes_reach_the_kernels():
    from torch._inductor.utils import run_and_get_code

    f = torch.compile(lambda x: (x.sin() + 1).cumsum(1) * x.shape[1])
    for i, n in enumerate([8, 16, 33]):
        x = torch.randn(3, n)
        xv = x.to("vnpu")
        torch._dynamo.mark_dynamic(xv, 1)
        if i == 0:
            out, (code,) = run_and_get_code(f, xv)
            assert "const int64_t ks0" in code  # the length: a by-value kernel argument
        else:
            out = f(xv)
        torch.testing.assert_close(out.cpu(), (x.sin() + 1).cumsum(1) * n)
    assert _graphs() == 1


def test_data_dependent_ops_graph_break_by_default():
    def g(x):
        return x[x > 0].sum() + torch.nonzero(x).shape[0]

    x = torch.randn(40)
    torch.testing.assert_close(torch.compile(g)(x.to("vnpu")).cpu(), g(x))
    assert sum(counters["graph_break"].values()) >= 1
    assert any("nonzero" in reason or "dynamic shape" in reason.lower() for reason in counters["graph_break"])


def test_data_dependent_ops_stay_in_the_graph_with_capture_flags():
    def g(x):
        return x[x > 0].sum() + torch.nonzero(x).shape[0] + x.sum().item() * x.max()

    x = torch.randn(40)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        out = torch.compile(g, fullgraph=True)(x.to("vnpu"))
    torch.testing.assert_close(out.cpu(), g(x), rtol=1e-5, atol=1e-5)
    assert _graphs() == 1 and not counters["graph_break"]
