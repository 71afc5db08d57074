"""torch.compile(mode="reduce-overhead") records vnpu graphs: Inductor's graph trees on vnpu.

Oracles: the same computation eager on CPU (tokens, values), compiled without graphs (training losses, bitwise),
and CUDA's documented graph-tree behaviour (a warm-up call, then one recording per shape and replays; outputs a
later replay overwrote raise; inputs the graphs cannot take are skipped with Inductor's reason).
"""

import copy
import gc
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from torch_vnpu import _C
from torch_vnpu._inductor import graph_trees
from torch_vnpu.testing.static_cache_llama import Transformer, decode_one_token


@pytest.fixture(autouse=True)
def fresh_trees():
    torch._dynamo.reset()  # also resets the graph trees
    counters.clear()
    with torch._inductor.config.patch({"triton.slow_path_cudagraph_asserts": True}):  # checks the pool each step
        yield
    torch._dynamo.reset()
    gc.collect()


@pytest.fixture
def graph_calls(monkeypatch):
    """Counts vnpu graph recordings and replays. The tree manager captures one empty graph to keep its memory
    pool alive (as on CUDA); ``recordings`` leaves it out."""
    calls = {"captures": 0, "replays": 0}
    capture_end, replay = torch.vnpu.VNPUGraph.capture_end, torch.vnpu.VNPUGraph.replay

    def counted_capture_end(g):
        calls["captures"] += 1
        return capture_end(g)

    def counted_replay(g):
        calls["replays"] += 1
        return replay(g)

    monkeypatch.setattr(torch.vnpu.VNPUGraph, "capture_end", counted_capture_end)
    monkeypatch.setattr(torch.vnpu.VNPUGraph, "replay", counted_replay)

    class Calls:
        @property
        def recordings(self):
            return max(calls["captures"] - 1, 0)

        @property
        def captures(self):
            return calls["captures"]

        @property
        def replays(self):
            return calls["replays"]

    return Calls()


# ---- gpt-fast style decoding (torch_vnpu.testing.static_cache_llama: gpt-fast's model shape) ----------------


def generate(model, prompt, new_tokens, decode):
    device = prompt.device
    token = decode_one_token(model, prompt, torch.arange(prompt.shape[1], device=device))  # prefill: eager
    tokens, pos = [token], torch.tensor([prompt.shape[1]], device=device)
    for _ in range(new_tokens - 1):
        token = decode(model, token.clone(), pos).clone()
        tokens.append(token)
        pos += 1
    return torch.cat(tokens, 1).cpu()


def _model(device):
    torch.manual_seed(0)
    return Transformer().eval().to(device)


def test_gpt_fast_decode_records_once_and_replays(graph_calls):
    prompt = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cpu = generate(_model("cpu"), prompt, 12, decode_one_token)
        eager = generate(_model("vnpu"), prompt.to("vnpu"), 12, decode_one_token)
        model = _model("vnpu")
        decode = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
        compiled = generate(model, prompt.to("vnpu"), 12, decode)
        # 11 decode steps, one shape: a warm-up call, one recording, every later call a replay (the recording
        # call replays once too: capturing does not run the work).
        assert (graph_calls.recordings, graph_calls.replays) == (1, 10)
        again = generate(model, prompt.to("vnpu"), 12, decode)
    assert torch.equal(eager, cpu)
    assert torch.equal(compiled, cpu)
    assert torch.equal(again, cpu)
    assert (graph_calls.recordings, graph_calls.replays) == (1, 21)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_static_cache_generate_compiles_with_graphs(arch, graph_calls):
    transformers = pytest.importorskip("transformers")
    kwargs = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=300, max_position_embeddings=64)
    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[arch]

    def build(device):
        torch.manual_seed(0)
        return model_cls(config_cls(**kwargs)).eval().to(device)

    ids = torch.randint(1, 300, (1, 6), generator=torch.Generator().manual_seed(1))
    ref = build("cpu").generate(ids, max_new_tokens=10, do_sample=False, cache_implementation="static")
    model = build("vnpu")
    out = model.generate(ids.to("vnpu"), max_new_tokens=10, do_sample=False, cache_implementation="static")
    assert torch.equal(out.cpu(), ref)
    # generate() compiled the decode step by itself (transformers' default CompileConfig: reduce-overhead).
    assert hasattr(model, "_compiled_call")
    assert graph_calls.recordings == 1 and graph_calls.replays >= 7


def test_generate_with_a_dynamic_cache_stays_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, vocab_size=50)
    model = transformers.LlamaForCausalLM(cfg).eval().to("vnpu")
    model.generate(torch.ones(1, 3, dtype=torch.long, device="vnpu"), max_new_tokens=3, do_sample=False)
    assert not hasattr(model, "_compiled_call")  # as on CUDA: only compilable caches compile


# ---- training, trees, outputs ------------------------------------------------------------------------------


def test_training_losses_equal_compiled_without_graphs(graph_calls):
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(6)]

    def train(device, mode):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = torch.compile(model, mode=mode)
        losses = []
        for x, y in data:
            torch.compiler.cudagraph_mark_step_begin()
            loss = F.mse_loss(step(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses

    graphs = train("vnpu", "reduce-overhead")
    assert graph_calls.recordings == 2 and graph_calls.replays >= 8  # forward and backward
    assert graphs == train("vnpu", "default")
    torch.testing.assert_close(graphs, train("cpu", "default"))


def test_an_output_overwritten_by_a_later_replay_raises_cudas_error():
    f = torch.compile(lambda x: (x * 2).sin(), mode="reduce-overhead")
    x = torch.randn(64, device="vnpu")
    kept = [f(x) for _ in range(3)]
    torch.testing.assert_close(kept[-1].cpu(), (x.cpu() * 2).sin())
    with pytest.raises(RuntimeError, match="accessing tensor output of CUDAGraphs that has been overwritten by a "
                                           "subsequent run"):
        kept[1] + 1
    torch.compiler.cudagraph_mark_step_begin()
    fresh = f(x)
    torch.testing.assert_close(fresh.cpu(), (x.cpu() * 2).sin())


def test_tree_branches_restore_the_pool_checkpoint(monkeypatch):
    restores = []
    restore = graph_trees._BindingsOnVnpu._cuda_setCheckpointPoolState
    monkeypatch.setattr(graph_trees._BindingsOnVnpu, "_cuda_setCheckpointPoolState",
                        staticmethod(lambda *args: (restores.append(args[0]), restore(*args))[1]))
    f = torch.compile(lambda x: (x + 1) * 2, mode="reduce-overhead")
    g = torch.compile(lambda x: x.sin() + x, mode="reduce-overhead")
    h = torch.compile(lambda x: x.cos() * 3, mode="reduce-overhead")
    x = torch.randn(4096, device="vnpu")
    a_ref = (x.cpu() + 1) * 2
    for step in range(8):
        torch.compiler.cudagraph_mark_step_begin()
        a = f(x)  # f's output is alive while g or h (two children of f's graph) records or replays
        b = g(a) if step % 2 == 0 else h(a)
        torch.testing.assert_close(a.cpu(), a_ref)
        torch.testing.assert_close(b.cpu(), a_ref.sin() + a_ref if step % 2 == 0 else a_ref.cos() * 3)
    assert restores  # the second child recorded after restoring f's pool state


def test_a_new_shape_records_again_and_dynamic_graphs_follow_the_skip_flag(graph_calls):
    f = torch.compile(lambda x: x * 3 + 1, mode="reduce-overhead")
    for n in (8, 8, 8, 16, 16, 16, 8):
        x = torch.randn(n, device="vnpu")
        torch.testing.assert_close(f(x).cpu(), x.cpu() * 3 + 1)
    assert graph_calls.recordings == 2
    # With cudagraph_skip_dynamic_graphs, symbolic shapes get no graphs: partitioned out of them (the default,
    # graph_partition=True), or the whole graph skipped with Inductor's reason.
    for partition in (True, False):
        torch._dynamo.reset()
        with torch._inductor.config.patch({"triton.cudagraph_skip_dynamic_graphs": True,
                                           "graph_partition": partition}):
            g = torch.compile(lambda x: x * 5, mode="reduce-overhead", dynamic=True)
            for n in (4, 5, 6):
                x = torch.randn(n, device="vnpu")
                torch.testing.assert_close(g(x).cpu(), x.cpu() * 5)
    assert graph_calls.recordings == 2  # nothing more recorded
    assert counters["inductor"]["cudagraph_skips"] == 1


def test_a_mutated_input_skips_graphs_with_inductors_reason(graph_calls, caplog):
    def bump(x):
        x.add_(1)
        return x * 2

    f = torch.compile(bump, mode="reduce-overhead")
    x = torch.zeros(4, device="vnpu")
    with caplog.at_level(logging.WARNING, logger="torch._inductor.cudagraph_utils.__cudagraphs"):
        outs = [f(x) for _ in range(3)]
    assert torch.equal(x.cpu(), torch.full((4,), 3.0))  # once per call
    assert torch.equal(outs[-1].cpu(), torch.full((4,), 6.0))
    assert counters["inductor"]["cudagraph_skips"] == 1
    assert "skipping cudagraphs due to mutated inputs" in caplog.text
    assert graph_calls.recordings == 0


def test_a_cpu_tensor_in_the_graph_is_partitioned_out_or_skips_graphs(graph_calls):
    def f(x, c):
        return x * 2, c + 1

    x, c = torch.ones(4, device="vnpu"), torch.ones(3)
    compiled = torch.compile(f, mode="reduce-overhead")
    for _ in range(3):
        out, cpu_out = compiled(x, c)
    assert torch.equal(out.cpu(), torch.full((4,), 2.0)) and torch.equal(cpu_out, torch.full((3,), 2.0))
    assert cpu_out.device.type == "cpu" and graph_calls.recordings == 1  # the vnpu partition is a graph
    torch._dynamo.reset()
    with torch._inductor.config.patch(graph_partition=False):
        compiled = torch.compile(f, mode="reduce-overhead")
        for _ in range(3):
            out, cpu_out = compiled(x, c)
    assert torch.equal(out.cpu(), torch.full((4,), 2.0)) and torch.equal(cpu_out, torch.full((3,), 2.0))
    assert counters["inductor"]["cudagraph_skips"] == 1 and graph_calls.recordings == 1


@pytest.mark.parametrize("partition", [True, False])
def test_control_flow_and_data_dependent_shapes_run_without_graphs(partition):
    def branch(x):
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))

    def count(x):
        return torch.nonzero(x > 0).sum() * 2 + x.sum()

    with torch._inductor.config.patch(graph_partition=partition), \
            torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        f, g = torch.compile(branch, mode="reduce-overhead"), torch.compile(count, mode="reduce-overhead")
        for values in ([1.0, -1, 2, 3], [-1.0, -1, 2, -3], [1.0, 1, 1, 1], [-2.0, 0, 0, 0]):
            x = torch.tensor(values, device="vnpu")
            assert torch.equal(f(x).cpu(), branch(x.cpu()))
            assert torch.equal(g(x).cpu(), count(x.cpu()))
    # torch.cond: skipped with a reason (vnpu graphs have no conditional nodes). nonzero: partitioned out, or the
    # graph skipped for its data-dependent shape without partitions (Inductor's rule).
    assert counters["inductor"]["cudagraph_skips"] == (1 if partition else 2)


@pytest.mark.parametrize("trees,partition", [(True, True), (False, True), (True, False), (False, False)])
def test_a_python_float_argument_is_read_at_every_replay(trees, partition):
    # Dynamo passes a changing float as a 0-d CPU tensor: moved to the device outside the recorded graph (as for
    # CUDA), or the graph skipped without partitioning. Never its value at the recording.
    with torch._inductor.config.patch({"triton.cudagraph_trees": trees, "graph_partition": partition}):
        f = torch.compile(lambda x, s: x * s, mode="reduce-overhead")
        x = torch.ones(4, device="vnpu")
        for i in range(6):
            assert f(x, i + 0.5).tolist() == [i + 0.5] * 4
        c = torch.compile(lambda x, c: x * c, mode="reduce-overhead")
        for i in range(4):
            assert c(x, torch.tensor(i + 0.25)).tolist() == [i + 0.25] * 4


@pytest.mark.parametrize("opt_cls", [torch.optim.Adam, torch.optim.AdamW])
def test_a_compiled_optimizer_step_matches_float64(opt_cls):
    # Dynamo makes the compiled step capturable on vnpu (step counts on the device), as on CUDA: a CPU step count
    # would stay at its recorded value in the graph (Adam's bias correction frozen).
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    ref = copy.deepcopy(model).double()
    model = model.to("vnpu")
    opt, ref_opt = opt_cls(model.parameters(), lr=0.1), opt_cls(ref.parameters(), lr=0.1)
    step = torch.compile(opt.step, mode="reduce-overhead")
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
        opt.zero_grad()
        F.mse_loss(model(x.to("vnpu")), y.to("vnpu")).backward()
        step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x.double()), y.double()).backward()
        ref_opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu().double(), q.detach(), rtol=0, atol=1e-5)


def test_the_sanitizer_is_silent_on_a_training_loop(tmp_path):
    # The trees warm up and record on their own stream and drop the caller's inputs there (record_stream).
    code = ("import torch, torch.nn.functional as F\n"
            "m = torch.nn.Linear(8, 4).to('vnpu')\n"
            "step = torch.compile(lambda x, t: F.cross_entropy(m(x), t), mode='reduce-overhead')\n"
            "g = torch.Generator().manual_seed(0)\n"
            "for i in range(4):\n"
            "    torch.compiler.cudagraph_mark_step_begin()\n"
            "    loss = step(torch.randn(16, 8, generator=g).to('vnpu'), torch.randint(0, 4, (16,), generator=g).to('vnpu'))\n"
            "    m.zero_grad(set_to_none=True)\n"
            "    loss.backward()\n"
            "    print(loss.item())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, VNPU_SANITIZE="1"), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.split()) == 4


def test_a_second_backward_after_a_replay_raises_and_the_process_goes_on(tmp_path):
    # Known limitation: backward(retain_graph=True) then a second backward of a replayed step fails in the graph
    # trees' pool check (a RuntimeError). The process and later steps stay healthy.
    code = ("import torch\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.Linear(8, 4).to('vnpu')\n"
            "cm = torch.compile(m, mode='reduce-overhead')\n"
            "for i, c in enumerate('nrsnrss'):\n"
            "    torch.compiler.cudagraph_mark_step_begin()\n"
            "    x = torch.randn(5, 8, device='vnpu')\n"
            "    if c == 'n':\n"
            "        with torch.no_grad():\n"
            "            cm(x)\n"
            "        continue\n"
            "    o = cm(x)\n"
            "    m.zero_grad()\n"
            "    try:\n"
            "        (o ** 2).sum().backward(retain_graph=c == 'r')\n"
            "        if c == 'r':\n"
            "            o.sum().backward()\n"
            "        print(c, 'ok', torch.allclose(m.bias.grad.cpu(), (2 * o).sum(0).cpu() + (5 if c == 'r' else 0)))\n"
            "    except RuntimeError as e:\n"
            "        print(c, 'error')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert all(line in ("r ok True", "s ok True", "r error") for line in lines), lines
    assert lines[-2:] == ["s ok True", "s ok True"], lines


def test_each_device_gets_its_own_graphs():
    f = torch.compile(lambda x: x.sin() * 2, mode="reduce-overhead")
    a, b = torch.randn(5, device="vnpu:0"), torch.randn(5, device="vnpu:1")
    for _ in range(3):
        ya, yb = f(a), f(b)
        assert (ya.device, yb.device) == (a.device, b.device)
        torch.testing.assert_close(ya.cpu(), a.cpu().sin() * 2)
        torch.testing.assert_close(yb.cpu(), b.cpu().sin() * 2)


def test_random_ops_draw_as_without_graphs():
    f = torch.compile(lambda x: x + torch.rand_like(x), mode="reduce-overhead")
    g = torch.compile(lambda x: x + torch.rand_like(x), mode="default")
    x = torch.zeros(16, device="vnpu")
    torch.manual_seed(0)
    graphs = [f(x).cpu() for _ in range(4)]
    torch.manual_seed(0)
    plain = [g(x).cpu() for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(graphs, plain))
    assert not torch.equal(graphs[2], graphs[3])  # new numbers at every replay


def test_cudagraph_trees_off_uses_inductors_simple_cudagraphify(graph_calls):
    with torch._inductor.config.patch({"triton.cudagraph_trees": False}):
        f = torch.compile(lambda x: x.cos() + 1, mode="reduce-overhead")
        x = torch.randn(32, device="vnpu")
        outs = [f(x).clone() for _ in range(3)]
    for out in outs:
        torch.testing.assert_close(out.cpu(), x.cpu().cos() + 1)
    assert graph_calls.captures == 1 and graph_calls.replays == 3


def test_out_of_memory_while_recording_raises_and_returns_the_memory():
    f = torch.compile(lambda x: x.repeat(16, 1) * 2, mode="reduce-overhead")
    x = torch.randn(2**18, device="vnpu")
    gc.collect()
    baseline = torch.vnpu.memory_allocated()
    y = f(x)  # warm-up
    _, total = torch.vnpu.mem_get_info()
    torch.vnpu.set_per_process_memory_fraction(torch.vnpu.memory_reserved() / total)  # nothing more
    try:
        with pytest.raises(torch.OutOfMemoryError):
            y = f(x)  # records: its input copy in the pool does not fit
    finally:
        torch.vnpu.set_per_process_memory_fraction(1.0)
    for _ in range(3):
        y = f(x)
    assert torch.equal(y[3].cpu(), x.cpu() * 2)
    del y
    torch._dynamo.reset()
    gc.collect()
    torch.vnpu.empty_cache()
    assert torch.vnpu.memory_allocated() == baseline


# ---- the allocator's pool checkpoints (CUDA's getCheckpointState / setCheckpointPoolState) ------------------


def test_a_pool_checkpoint_restores_the_allocated_blocks():
    torch.vnpu.synchronize()
    pool = torch.vnpu.graph_pool_handle()
    _C._begin_allocate_current_thread_to_pool(0, pool)
    try:
        a = torch.empty(1000, device="vnpu")
        b = torch.empty(3000, device="vnpu")
        state = _C._get_checkpoint_state(0, pool)
        c = torch.empty(500, device="vnpu")  # allocated after the checkpoint
    finally:
        _C._end_allocate_to_pool(0, pool)
    ptrs = [t.data_ptr() for t in (a, b, c)]
    assert _C._check_pool_live_allocations(0, pool, set(ptrs))
    assert not _C._check_pool_live_allocations(0, pool, set(ptrs[:2]))
    # As the graph trees use it: the tensors alive now stop owning their blocks (stale), a non-owning storage
    # viewing a's memory takes a's re-allocated block, b's block is allocated again with no owner, c's is free.
    a_view = torch._C._construct_storage_from_data_pointer(ptrs[0], a.device, a.untyped_storage().nbytes())
    stale = [t.untyped_storage()._cdata for t in (a, b, c)]
    _C._set_checkpoint_pool_state(0, state, stale, [a_view._cdata])
    assert _C._check_pool_live_allocations(0, pool, set(ptrs[:2]))
    assert _C._has_standard_deleter(a_view._cdata) and not _C._has_standard_deleter(a.untyped_storage()._cdata)
    _C._caching_allocator_delete(ptrs[1])  # the trees free blocks whose tensors died since the checkpoint
    assert _C._check_pool_live_allocations(0, pool, {ptrs[0]})
    del a_view  # the owner now: its death frees the block
    assert _C._check_pool_live_allocations(0, pool, set())
    del a, b, c  # stale: no effect on the pool
    assert _C._check_pool_live_allocations(0, pool, set())
    with pytest.raises(RuntimeError, match="does not exist"):
        _C._get_checkpoint_state(0, (0, 987654321))
    _C._release_pool(0, pool)
