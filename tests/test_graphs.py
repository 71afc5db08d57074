"""Graph capture and replay on vnpu (torch.vnpu.VNPUGraph / torch.vnpu.graph / torch.accelerator.Graph).

Oracle: the same work run eagerly on vnpu (bitwise: the same CPU kernels run on the same data) and on the CPU
backend; CUDA graphs' documented semantics for static addresses, memory pools, capture errors and RNG.
"""

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

CAPTURE_ERROR = "operation not permitted when stream is capturing"


def _warmup(fn, *args, iters=2):
    """Runs ``fn`` on a side stream first (as CUDA's docs ask: lazy initialisation stays out of the capture)."""
    s = torch.vnpu.Stream()
    s.wait_stream(torch.vnpu.current_stream())
    with torch.vnpu.stream(s):
        for _ in range(iters):
            fn(*args)
    torch.vnpu.current_stream().wait_stream(s)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def test_mlp_replay_equals_eager_and_cpu_and_sees_new_inputs():
    cpu_model = _mlp().eval()
    model = _mlp().to("vnpu").eval()
    static_x = torch.randn(4, 16).to("vnpu")
    with torch.no_grad():
        _warmup(model, static_x)
        g = torch.vnpu.VNPUGraph()
        with torch.vnpu.graph(g):
            static_y = model(static_x)
        for i in range(3):
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i))
            static_x.copy_(x)  # new contents, same address
            g.replay()
            eager = model(x.to("vnpu"))
            assert torch.equal(static_y.cpu(), eager.cpu())
            torch.testing.assert_close(static_y.cpu(), cpu_model(x))


def test_replay_is_stream_ordered_on_any_stream_and_skips_the_dispatcher():
    a = torch.arange(1000, dtype=torch.float32, device="vnpu")
    side = torch.vnpu.Stream()
    g = torch.vnpu.VNPUGraph()
    _warmup(lambda: (a * 3).sin_().add_(1))
    with torch.vnpu.graph(g, stream=side):
        out = (a * 3).sin_().add_(1)
    expected = lambda t: (t * 3).sin_().add_(1)  # noqa: E731
    torch.vnpu.reset_op_stats()
    for k in range(3):
        # On the default stream (not the capture stream), between eager ops and with no host sync: only
        # stream order makes the replay see a.fill_() and the next op see the replay's result.
        a.fill_(float(k))
        g.replay()
        doubled = out * 2
        torch.testing.assert_close(doubled.cpu(), expected(torch.full((1000,), float(k))) * 2)
    executed = torch.vnpu.get_executed_ops()
    assert not any(n for name, n in executed.items() if name.startswith(("aten::sin", "aten::add"))), executed


def test_attention_block_replay_equals_eager():
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True).eval()
    cpu_block = block
    vblock = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                              batch_first=True).eval()
    vblock.load_state_dict(block.state_dict())
    vblock.to("vnpu")
    q = torch.randn(2, 5, 8, 16)

    def sdpa_block(x):
        # an explicit sdpa attention (causal) next to the module's own attention path
        att = F.scaled_dot_product_attention(x, x * 0.5, x + 1.0, is_causal=True)
        return att.transpose(1, 2).reshape(2, 8, 80)

    static_q = q.to("vnpu")
    static_h = torch.randn(2, 7, 32).to("vnpu")
    mask = torch.nn.Transformer.generate_square_subsequent_mask(7).to("vnpu")
    with torch.no_grad():
        _warmup(lambda: (sdpa_block(static_q), vblock(static_h, src_mask=mask, is_causal=True)))
        g = torch.vnpu.VNPUGraph()
        with torch.vnpu.graph(g):
            out_sdpa = sdpa_block(static_q)
            out_block = vblock(static_h, src_mask=mask, is_causal=True)
        for seed in range(2):
            gen = torch.Generator().manual_seed(seed)
            new_q, new_h = torch.randn(2, 5, 8, 16, generator=gen), torch.randn(2, 7, 32, generator=gen)
            static_q.copy_(new_q)
            static_h.copy_(new_h)
            g.replay()
            assert torch.equal(out_sdpa.cpu(), sdpa_block(new_q.to("vnpu")).cpu())
            assert torch.equal(out_block.cpu(), vblock(new_h.to("vnpu"), src_mask=mask, is_causal=True).cpu())
            torch.testing.assert_close(out_sdpa.cpu(), sdpa_block(new_q))
            torch.testing.assert_close(out_block.cpu(), cpu_block(new_h, src_mask=mask.cpu(), is_causal=True))


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = 0
    return model


def _greedy_decode(model, prompt, steps, max_len, device, graph):
    """Greedy decoding with a static cache: prefill eagerly, then one token per step, the step either eager or
    captured once and replayed (``graph``)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=max_len)
    p = prompt.shape[1]
    static_ids = torch.zeros(prompt.shape[0], 1, dtype=torch.long, device=device)
    static_pos = torch.zeros(1, dtype=torch.long, device=device)

    def prefill():
        cache.reset()  # in place: the layers' tensors (and their write position) keep their addresses
        out = model(input_ids=prompt, cache_position=torch.arange(p, device=device), past_key_values=cache,
                    use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        static_ids.copy_(tok)
        static_pos.fill_(p)
        return tok

    def step():
        return model(input_ids=static_ids, cache_position=static_pos, past_key_values=cache, use_cache=True).logits

    tokens = [prefill()]
    if graph:
        # Warm-up outside the capture; it advances the cache's own write position, so prefill again after it.
        _warmup(step, iters=1)
        tokens = [prefill()]
        g = torch.vnpu.VNPUGraph()
        with torch.vnpu.graph(g):
            static_logits = step()
    for _ in range(steps - 1):
        if graph:
            g.replay()
            logits = static_logits
        else:
            logits = step()
        tok = logits[:, -1:].argmax(-1)
        tokens.append(tok)
        static_ids.copy_(tok)
        static_pos.add_(1)
    return torch.cat(tokens, dim=1).cpu()


def test_static_cache_decode_step_replay_equals_eager_and_cpu():
    pytest.importorskip("transformers")
    model = _tiny_llama()
    prompt = torch.randint(1, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cpu_tokens = _greedy_decode(model, prompt, steps=8, max_len=24, device="cpu", graph=False)
        model.to("vnpu")
        eager = _greedy_decode(model, prompt.to("vnpu"), steps=8, max_len=24, device="vnpu", graph=False)
        replayed = _greedy_decode(model, prompt.to("vnpu"), steps=8, max_len=24, device="vnpu", graph=True)
    assert torch.equal(replayed, eager)
    assert torch.equal(replayed, cpu_tokens)


@pytest.mark.parametrize("illegal", ["item", "cpu", "synchronize", "nonzero", "pageable_copy", "event_sync",
                                     "cross_stream"])
def test_illegal_operation_during_capture_raises_and_process_stays_healthy(illegal):
    x = torch.arange(8, dtype=torch.float32, device="vnpu")
    keep = x * 10  # a tensor from before the capture must come out untouched
    _warmup(lambda: x * 2 + 1)
    g = torch.vnpu.VNPUGraph()
    match = {"event_sync": "event recorded in the capturing stream",
             "cross_stream": "waits on an event recorded outside the capture"}.get(illegal, CAPTURE_ERROR)
    with pytest.raises(RuntimeError, match=match) as info:
        with torch.vnpu.graph(g):
            y = x * 2 + 1
            if illegal == "item":
                y.sum().item()
            elif illegal == "cpu":
                y.cpu()
            elif illegal == "synchronize":
                torch.vnpu.synchronize()
            elif illegal == "nonzero":
                torch.nonzero(y)
            elif illegal == "pageable_copy":
                torch.tensor([1.0, 2.0], device="vnpu")
            elif illegal == "event_sync":
                torch.vnpu.current_stream().record_event().synchronize()
            elif illegal == "cross_stream":  # a replay cannot depend on work outside the graph
                other = torch.vnpu.Stream()
                with torch.vnpu.stream(other):
                    torch.vnpu._sleep(1000)
                torch.vnpu.current_stream().wait_stream(other)
    assert "capture" in str(info.value)
    assert not torch.vnpu.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    # Healthy: eager work, synchronization and a new capture with the same object all work.
    torch.vnpu.synchronize()
    assert torch.equal(keep.cpu(), torch.arange(8, dtype=torch.float32) * 10)
    g.reset()
    with torch.vnpu.graph(g):
        z = x * 2 + 1
    x.add_(1)
    g.replay()
    assert torch.equal(z.cpu(), (torch.arange(8, dtype=torch.float32) + 1) * 2 + 1)


def test_fork_join_capture_replays_like_eager():
    # Note [Cross-stream capture] (runtime graph.cpp): a side stream that waits on the capturing stream joins the
    # capture, as on CUDA; the graph then holds both streams' work (before: "cross-stream capture is not supported").
    side = torch.vnpu.Stream()
    x = torch.randn(64, device="vnpu")
    _warmup(lambda: ((x * 2) + 1) * 3)
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        a = x * 2
        side.wait_stream(torch.vnpu.current_stream())  # fork
        with torch.vnpu.stream(side):
            b = a + 1  # allocated on the side stream, from the graph's pool
        torch.vnpu.current_stream().wait_stream(side)  # join
        c = b * 3
    for _ in range(3):
        new = torch.randn(64)
        x.copy_(new)
        g.replay()
        assert torch.equal(c.cpu(), (new * 2 + 1) * 3)
    # Unjoined: the side stream's last work is not waited for; no graph, the streams stay usable.
    g2 = torch.vnpu.VNPUGraph()
    with pytest.raises(RuntimeError, match="capture unjoined.*never waited for"):
        with torch.vnpu.graph(g2):
            d = x * 2
            side.wait_stream(torch.vnpu.current_stream())
            with torch.vnpu.stream(side):
                d.add_(1)
    with torch.vnpu.stream(side):
        e = x + 1
    torch.vnpu.current_stream().wait_stream(side)
    assert torch.equal(e.cpu(), x.cpu() + 1)


def test_random_ops_on_a_joined_stream_draw_new_numbers_per_replay():
    side = torch.vnpu.Stream()
    x = torch.zeros(256, device="vnpu")
    _warmup(lambda: torch.rand_like(x))
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        side.wait_stream(torch.vnpu.current_stream())
        with torch.vnpu.stream(side):
            r = torch.rand_like(x)
        torch.vnpu.current_stream().wait_stream(side)
        out = r * 2
    torch.manual_seed(7)
    g.replay()
    first = out.cpu()
    g.replay()
    second = out.cpu()
    assert not torch.equal(first, second)  # a new draw per replay, as CUDA graphs
    torch.manual_seed(7)
    eager = torch.rand_like(x) * 2  # the same generator state gives eager's numbers
    assert torch.equal(first, eager.cpu())


def test_make_graphed_callables_after_a_capture_of_the_same_module():
    # Found by the sanitizer break test of 2026-12-02: the first capture leaves the parameters' AccumulateGrad
    # nodes on its stream, so the backward capture forks to that stream. Before: "cross-stream capture" and then
    # memory corruption (abort, segfault or hang); now the graphed module trains like the eager one.
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64).to("vnpu")
    ref = torch.nn.Linear(64, 64).to("vnpu")
    ref.load_state_dict(m.state_dict())
    static_x = torch.zeros(64, 64, device="vnpu")
    _warmup(lambda: m(static_x).relu(), iters=3)
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        static_y = m(static_x).relu()
    for _ in range(2):
        static_x.copy_(torch.randn(64, 64))
        g.replay()
        assert torch.equal(static_y.cpu(), ref(static_x).relu().cpu())
    del static_y
    graphed = torch.vnpu.make_graphed_callables(m, (torch.randn(8, 64, device="vnpu", requires_grad=True),))
    for _ in range(3):
        inp = torch.randn(8, 64, device="vnpu")
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        graphed(inp).square().sum().backward()
        ref(inp).square().sum().backward()
        assert torch.equal(m.weight.grad.cpu(), ref.weight.grad.cpu())
        assert torch.equal(m.bias.grad.cpu(), ref.bias.grad.cpu())


def test_capture_end_reports_the_invalidating_call():
    x = torch.ones(4, device="vnpu")
    g = torch.vnpu.VNPUGraph()
    s = torch.vnpu.Stream()
    with torch.vnpu.stream(s):
        g.capture_begin()
        assert torch.vnpu.is_current_stream_capturing()
        y = x + 1
        with pytest.raises(RuntimeError, match=CAPTURE_ERROR):
            y.tolist()
        with pytest.raises(RuntimeError, match="previous error during capture"):
            y + 1  # later work on the invalidated capture fails too, as on CUDA
        with pytest.raises(RuntimeError, match="invalidated by an earlier call.*pageable host memory"):
            g.capture_end()
    assert not torch.vnpu.is_current_stream_capturing()


def test_capture_on_default_stream_and_misuse_raise():
    g = torch.vnpu.VNPUGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    x = torch.ones(2, device="vnpu")
    with torch.vnpu.graph(g):
        x.mul_(2)
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        with torch.vnpu.graph(g):
            pass
    g.replay()
    assert torch.equal(x.cpu(), torch.full((2,), 2.0))  # captured work did not run at capture time


def test_rng_draws_new_numbers_per_replay_like_eager():
    x = torch.ones(64, device="vnpu")

    def f():
        return F.dropout(x, p=0.5, training=True) + torch.rand(64, device="vnpu")

    _warmup(f)
    torch.vnpu.manual_seed(123)
    eager = [f().cpu() for _ in range(3)]
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        out = f()
    torch.vnpu.manual_seed(123)
    replays = []
    for _ in range(3):
        g.replay()
        replays.append(out.cpu())
    for e, r in zip(eager, replays):
        assert torch.equal(e, r)  # each replay draws what eager execution from the same state draws
    assert not torch.equal(replays[0], replays[1])
    assert f().cpu().ne(eager[0]).any()  # the generator advanced past the replays


def _settled_reserved():
    """memory_reserved() once cyclic garbage of earlier tests is freed and the cache emptied: torch.vnpu.graph()
    collects garbage on entry (as torch.cuda.graph does), which would otherwise free other tests' tensors then."""
    torch.vnpu.synchronize()
    gc.collect()
    torch.vnpu.empty_cache()
    return torch.vnpu.memory_reserved()


def test_pool_memory_released_on_reset():
    x = torch.randn(256, 256, device="vnpu")
    base = _settled_reserved()
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        h = x @ x  # 256 KiB intermediates and output, from the graph's pool
        y = torch.relu(h) + 1
        del h
    in_graph = torch.vnpu.memory_reserved()
    assert in_graph > base
    del y
    torch.vnpu.empty_cache()
    assert torch.vnpu.memory_reserved() == in_graph  # the graph still holds its pool
    g.reset()
    torch.vnpu.empty_cache()
    assert torch.vnpu.memory_reserved() == base


def test_block_freed_during_capture_waits_for_its_streams_after_the_capture():
    # A block used by another stream and freed during a capture gets its stream events when the capture
    # ends (CUDA's allocator defers them too). Until then it must not count as free: before the fix, freeing
    # its neighbour merged the two, the merged block went back to the pool while the other stream still
    # used it, and ending the capture then touched the deleted block (memory corruption, found with
    # make_graphed_callables after an invalidated capture).
    side = torch.vnpu.Stream()
    x = torch.zeros(1024, device="vnpu")  # 4 KiB blocks of one small segment, side by side
    y = torch.zeros(1024, device="vnpu")
    x_ptr = x.data_ptr()
    assert y.data_ptr() == x_ptr + x.nbytes
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g, capture_error_mode="relaxed"):
        captured = torch.ones(8, device="vnpu") * 2
        with torch.vnpu.stream(side):  # not capturing: runs now, and is busy past the capture
            torch.vnpu._sleep(300_000_000)
            x.add_(1)
        x.record_stream(side)
        del x, y
    w = torch.empty(2048, device="vnpu")  # as large as both: the merged block, if there were one
    assert not side.query(), "the side stream finished too early for this test to mean anything"
    assert w.data_ptr() != x_ptr
    side.synchronize()
    g.replay()
    assert captured.tolist() == [2.0] * 8


def test_pool_shared_between_graphs_and_output_outliving_reset():
    x = torch.randn(128, 128, device="vnpu")
    base = _settled_reserved()
    pool = torch.vnpu.graph_pool_handle()
    g1, g2 = torch.vnpu.VNPUGraph(), torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g1, pool=pool):
        y1 = x * 2
    with torch.vnpu.graph(g2, pool=g1.pool()):
        y2 = y1 + 1
    assert g1.pool() == g2.pool() == pool
    x.fill_(1.0)
    g1.replay()
    g2.replay()
    assert torch.equal(y2.cpu(), torch.full((128, 128), 3.0))
    g1.reset()
    g2.reset()
    torch.vnpu.empty_cache()
    assert torch.vnpu.memory_reserved() > base  # y1, y2 still live in the pool's segment
    assert torch.equal(y1.cpu(), torch.full((128, 128), 2.0))
    del y1, y2
    torch.vnpu.empty_cache()
    assert torch.vnpu.memory_reserved() == base


def test_accelerator_graph_and_keep_graph_debug_dump(tmp_path):
    x = torch.ones(3, device="vnpu")
    s = torch.vnpu.Stream()
    g = torch.accelerator.Graph()
    with torch.vnpu.stream(s), g:
        y = x * 5
    x.fill_(2.0)
    g.replay()
    assert torch.equal(y.cpu(), torch.full((3,), 10.0))
    # The context manager accepts the generic object too; keep_graph keeps it for instantiate()/debug_dump().
    k = torch.vnpu.VNPUGraph(keep_graph=True)
    with torch.vnpu.graph(k):
        z = x.exp().neg()
    k.instantiate()
    path = tmp_path / "graph.dot"
    k.debug_dump(str(path))
    text = path.read_text()
    assert "aten::exp" in text and "aten::neg" in text
    k.replay()
    torch.testing.assert_close(z.cpu(), -torch.full((3,), 2.0).exp())
    a = torch.accelerator.Graph()
    with torch.vnpu.graph(a, capture_error_mode="relaxed"):
        w = x + 1
    a.replay()
    assert torch.equal(w.cpu(), torch.full((3,), 3.0))


def test_capture_under_launch_blocking_records():
    code = textwrap.dedent("""
        import torch
        x = torch.ones(4, device="vnpu")
        g = torch.vnpu.VNPUGraph()
        with torch.vnpu.graph(g):
            y = x * 3
        x.fill_(2.0)
        g.replay()
        print(y.tolist())
        try:
            with torch.vnpu.graph(torch.vnpu.VNPUGraph()):
                (x + 1).sum().item()
        except RuntimeError as e:
            print("refused" if "not permitted when stream is capturing" in str(e) else e)
    """)
    env = dict(os.environ, VNPU_LAUNCH_BLOCKING="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[6.0,", "6.0,", "6.0,", "6.0]", "refused"]


def test_make_graphed_callables_matches_eager_training():
    import copy

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("vnpu")
    model = copy.deepcopy(ref)

    def fn(a, b):
        return (a * b).sum(dim=1, keepdim=True).tanh()

    gen = torch.Generator().manual_seed(3)
    sample = torch.randn(5, 8, generator=gen).to("vnpu")
    a0 = torch.randn(5, 8, generator=gen).to("vnpu").requires_grad_()
    b0 = torch.randn(5, 8, generator=gen).to("vnpu")
    graphed_model, graphed_fn = torch.vnpu.make_graphed_callables((model, fn), ((sample,), (a0, b0)))
    assert graphed_model is model
    for _ in range(3):
        x = torch.randn(5, 8, generator=gen).to("vnpu")
        a = torch.randn(5, 8, generator=gen).to("vnpu").requires_grad_()
        b = torch.randn(5, 8, generator=gen).to("vnpu")
        a_ref = a.detach().clone().requires_grad_()
        (graphed_model(x).pow(2).sum() + graphed_fn(a, b).sum()).backward()
        (ref(x).pow(2).sum() + fn(a_ref, b).sum()).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p.grad.cpu(), q.grad.cpu())
            p.grad = None
            q.grad = None
        assert torch.equal(a.grad.cpu(), a_ref.grad.cpu())
    model.eval()  # not the captured mode: the original forward runs
    assert torch.equal(model(x).cpu(), ref.eval()(x).cpu())


def test_optimizer_step_capture_needs_capturable_as_on_cuda():
    # torch.optim checks capture only for cuda/xpu; without vnpu's check a capturable=False Adam was captured and
    # its replays reused the capture step's bias corrections (parameters silently off by ~4e-2 after 5 replays).
    import copy

    model = _mlp().to("vnpu")
    x = torch.randn(4, 16, device="vnpu")
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        assert torch.accelerator.current_stream().is_capturing()  # torch.Stream's query, as torch.optim asks
    assert not torch.accelerator.current_stream().is_capturing()

    def step(m, opt):
        opt.zero_grad(set_to_none=False)
        m(x).square().sum().backward()
        opt.step()

    plain = torch.optim.Adam(model.parameters(), lr=0.1)
    _warmup(step, model, plain)
    before = [p.detach().cpu() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="capturable is False"):
        with torch.vnpu.graph(torch.vnpu.VNPUGraph()):
            step(model, plain)
    assert all(torch.equal(a, p.detach().cpu()) for a, p in zip(before, model.parameters()))

    # capturable=True: replays equal eager steps bitwise, the step counters advance on the device.
    model = _mlp().to("vnpu")
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1, capturable=True)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1, capturable=True)
    _warmup(step, model, opt)
    _warmup(step, ref, ref_opt)
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        step(model, opt)
    for _ in range(4):  # the capture itself ran nothing
        g.replay()
        step(ref, ref_opt)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach().cpu())
        assert opt.state[p]["step"].item() == ref_opt.state[q]["step"].item() == 6
