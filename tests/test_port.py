"""Port mode (torch_vnpu.port): CUDA scripts run unedited on vnpu, against the same scripts on the CPU.

The scripts in port_scripts/ are written for CUDA; each runs in a fresh interpreter under
``python -m torch_vnpu.port.run`` and once on the CPU (their own --device=cpu / --no-cuda / --cpu switch)."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_vnpu.port import check

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "port_scripts")
sys.path.insert(0, HERE)


def _run(args: list[str], tmp_path, env: dict | None = None, expect_ok: bool = True, timeout: float = 300):
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore::FutureWarning", **(env or {}))
    proc = subprocess.run([sys.executable, *args], env=full_env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(tmp_path))
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _script(name, tmp_path, port: bool, *args) -> dict:
    out = tmp_path / f"{name}-{'port' if port else 'cpu'}-{len(os.listdir(tmp_path))}.json"
    cmd = (["-m", "torch_vnpu.port.run"] if port else []) + [os.path.join(SCRIPTS, name), *args]
    if name == "nanogpt_cuda.py":
        cmd.append(f"--out={out}")
    else:
        cmd += ["--out", str(out)]
    _run(cmd, tmp_path)
    return json.loads(out.read_text())


def test_nanogpt_style_loop_fp32_matches_cpu(tmp_path):
    cpu = _script("nanogpt_cuda.py", tmp_path, False, "--device=cpu")
    port = _script("nanogpt_cuda.py", tmp_path, True, "--dtype=float32")
    assert cpu["device_type"] == "cpu" and cpu["param_devices"] == ["cpu"] and not cpu["fused"]
    # The script's own CUDA branches ran: pinned batches, fused AdamW, on vnpu.
    assert port["device_type"] == "cuda" and port["cuda_available"]
    assert port["param_devices"] == ["vnpu"] and port["x_device"] == "vnpu:0" and not port["x_is_cuda"]
    assert port["pinned"] and port["fused"] and port["max_memory_allocated"] > 0
    assert port["logits_dtype"] == "torch.float32"
    # fused AdamW (vnpu) vs the for-loop AdamW (CPU): same math, another summation order.
    torch.testing.assert_close(torch.tensor(port["losses"]), torch.tensor(cpu["losses"]), rtol=1e-5, atol=0)
    assert port["losses"][-1] < port["losses"][0]


def test_nanogpt_style_loop_amp_bf16_and_fp16_scaler(tmp_path):
    cpu = _script("nanogpt_cuda.py", tmp_path, False, "--device=cpu")
    bf16 = _script("nanogpt_cuda.py", tmp_path, True)  # dtype from torch.cuda.is_bf16_supported()
    fp16 = _script("nanogpt_cuda.py", tmp_path, True, "--dtype=float16")
    assert bf16["dtype"] == "bfloat16" and bf16["logits_dtype"] == "torch.bfloat16" and not bf16["scaler_enabled"]
    assert fp16["logits_dtype"] == "torch.float16"
    assert fp16["scaler_enabled"] and fp16["scaler_device"] == "vnpu" and fp16["scale"] > 0
    for run in (bf16, fp16):
        assert run["fused"] and run["pinned"] and run["param_devices"] == ["vnpu"]
        # AMP vs fp32: bf16 has 8 mantissa bits; losses (~4.2) within 2%.
        torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(cpu["losses"]), rtol=2e-2, atol=0)


def test_mnist_style_script_matches_cpu(tmp_path):
    pytest.importorskip("sklearn")
    # Without dropout the runs are comparable step by step: the dropout masks of a vnpu run come from the vnpu
    # generator (as a CUDA run's from the CUDA generator), which the CPU run does not share.
    cpu = _script("mnist_cuda.py", tmp_path, False, "--no-cuda", "--dropout", "0")
    port = _script("mnist_cuda.py", tmp_path, True, "--dropout", "0")
    assert not cpu["use_cuda"] and port["use_cuda"]
    assert port["param_devices"] == ["vnpu"] and port["pinned_batches"] and port["pin_memory_device"] == "vnpu"
    assert port["losses"] == cpu["losses"]  # fp32, same kernels: bitwise
    assert port["tests"] == cpu["tests"]
    with_dropout = _script("mnist_cuda.py", tmp_path, True)
    assert with_dropout["param_devices"] == ["vnpu"]
    for run in (port, with_dropout):
        assert run["tests"][-1][1] > 0.8 * 397  # it learned: > 80% of the 397 held-out digits


# Two HF Trainer runs in fresh interpreters (~35 s): `make test-slow`; port mode's HF path stays covered by
# test_port_mode_mappings_in_process and test_integrations_autoload.
@pytest.mark.slow
def test_hf_trainer_script_matches_cpu(tmp_path):
    pytest.importorskip("transformers")
    cpu = _script("hf_trainer_cuda.py", tmp_path, False, "--cpu", "--output-dir", str(tmp_path / "c"))
    port = _script("hf_trainer_cuda.py", tmp_path, True, "--output-dir", str(tmp_path / "p"))
    assert cpu["args_device"] == "cpu" and port["args_device"].startswith("vnpu")
    assert port["param_devices"] == ["vnpu"] and port["generated_device"] == "vnpu:0"
    torch.testing.assert_close(torch.tensor(port["losses"]), torch.tensor(cpu["losses"]), rtol=1e-5, atol=0)
    assert port["generated"] == cpu["generated"]


def test_torch_compile_under_port_mode_matches_cpu(tmp_path):
    # A CUDA script that compiles its model (Inductor's vnpu backend) with a "cuda" device string inside the
    # compiled forward, against the same script eager on the CPU. One tiny model: forward + backward graphs.
    port = _script("compile_cuda.py", tmp_path, True)
    cpu = _script("compile_cuda.py", tmp_path, False, "--cpu", "--no-compile")
    assert port["device"] == "cuda" and cpu["device"] == "cpu"
    assert port["param_devices"] == ["vnpu"] and port["logits_device"] == "vnpu:0"
    assert port["unique_graphs"] == 1 and port["graph_breaks"] == 0 and port["inductor_graphs"] == 2, port
    # Inductor's fused kernels and fused AdamW vs eager kernels and for-loop AdamW: fp32, another order.
    torch.testing.assert_close(torch.tensor(port["losses"]), torch.tensor(cpu["losses"]), rtol=1e-5, atol=0)
    for k, v in cpu["params"].items():
        torch.testing.assert_close(torch.tensor(port["params"][k]), torch.tensor(v), rtol=0, atol=1e-5, msg=k)
    assert port["losses"][-1] < port["losses"][0]


def test_reduce_overhead_under_port_mode_records_graphs_and_matches_cpu(tmp_path):
    # The same script with mode="reduce-overhead": Inductor's CUDA-graph trees record vnpu graphs (forward and
    # backward) and replay them; losses as without graphs.
    port = _script("compile_cuda.py", tmp_path, True, "--mode", "reduce-overhead")
    cpu = _script("compile_cuda.py", tmp_path, False, "--cpu", "--no-compile")
    assert port["graph_recordings"] == 2 and port["cudagraph_skips"] == 0, port
    torch.testing.assert_close(torch.tensor(port["losses"]), torch.tensor(cpu["losses"]), rtol=1e-5, atol=0)


def _ddp_reference(world: int, steps: int = 5):
    """What DDP computes for port_scripts/ddp_cuda.py, in one CPU process: each rank's loss on its own batch,
    the gradient averaged over the ranks, SGD."""
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gens = [torch.Generator().manual_seed(r) for r in range(world)]
    losses = []
    for _ in range(steps):
        batches = [(torch.randn(32, 20, generator=g), torch.randn(32, 1, generator=g)) for g in gens]
        opt.zero_grad()
        per_rank = [torch.nn.functional.mse_loss(model(x), y) for x, y in batches]
        (sum(per_rank) / world).backward()
        opt.step()
        losses.append(per_rank[0].item())
    return losses, model


@pytest.mark.parametrize("nodes", [1, 2])
def test_ddp_tutorial_script_with_nccl_under_port_mode(nodes, tmp_path):
    """torch.cuda.set_device(LOCAL_RANK) + init_process_group("nccl") + DDP(device_ids=[gpu]), launched by torchrun
    on one node (2 processes) and as two nodes (--nnodes 2 --rdzv-backend c10d): vccl, results as DDP's math."""
    from torch_vnpu.testing.distributed import free_port

    root = os.path.join(HERE, "..")
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    if nodes == 1 and os.path.realpath(os.path.dirname(os.path.dirname(sys.executable))) == os.path.realpath(
            os.path.join(root, ".venv")):
        # docs/distributed.md's command, as written, from the repository root
        import docs_snippets

        out = pathlib.Path(root, "out", "ddp_cuda.json")
        out.unlink(missing_ok=True)
        block = docs_snippets.block("distributed.md", "test_ddp_tutorial_script_with_nccl_under_port_mode")
        commands = [["bash", "-c", block]]
        cwd = root
    else:
        out = tmp_path / "ddp.json"
        script = [os.path.join(SCRIPTS, "ddp_cuda.py"), str(out)]
        port = free_port()
        if nodes == 1:
            launches = [["--nproc-per-node", "2", "--master-port", str(port)]]
        else:
            launches = [["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         f"127.0.0.1:{port}"]] * 2
        commands = [[sys.executable, "-m", "torch.distributed.run", *launch, "-m", "torch_vnpu.port.run", *script]
                    for launch in launches]
        cwd = str(tmp_path)
    procs = [subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in commands]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    got = json.loads(out.read_text())
    losses, model = _ddp_reference(2)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(got["weight"]), model.weight.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(got["bias"]), model.bias.detach(), rtol=1e-5, atol=1e-6)
    assert got["device"] == "vnpu:0" and got["backend"] == "vccl" and got["nccl_available"] == [True] * 4
    assert got["pair"] == [[3.0, 3.0], [3.0, 3.0], "vnpu:0", "cpu:gloo,vnpu:vccl"]
    assert got["mesh"] == ["vnpu", [3.0, 3.0, 3.0], "vnpu:0"]


def test_mp_spawn_children_run_in_port_mode(tmp_path):
    """mp.spawn's children import torch afresh: port mode reaches them through the environment (they failed at
    torch.cuda.set_device). DDP's gradient is the mean of the ranks' gradients."""
    from torch_vnpu.testing.distributed import free_port

    out = tmp_path / "spawn.json"
    _run(["-m", "torch_vnpu.port.run", os.path.join(SCRIPTS, "ddp_spawn_cuda.py"), str(out), str(free_port())],
         tmp_path, timeout=240)
    got = json.loads(out.read_text())
    torch.manual_seed(0)
    model = torch.nn.Linear(20, 1)
    grads = []
    for rank in range(torch.vnpu.device_count()):
        model.zero_grad()
        x = torch.randn(8, 20, generator=torch.Generator().manual_seed(rank))
        model(x).square().mean().backward()
        grads.append(model.weight.grad.clone())
    torch.testing.assert_close(torch.tensor(got["grad"]), sum(grads) / len(grads), rtol=1e-5, atol=1e-6)
    assert got["device"] == "vnpu:0" and got["backend"] == "vccl"


def test_port_mode_backend_strings():
    from torch_vnpu.port._cuda import map_backend

    assert map_backend("nccl") == "vccl" and map_backend("NCCL") == "vccl"
    assert map_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,vnpu:vccl"
    assert map_backend("cuda:nccl") == "vnpu:vccl"
    for unchanged in ("gloo", "vccl", "cpu:gloo", "cpu:gloo,vnpu:vccl", "mpi"):
        assert map_backend(unchanged) == unchanged


def test_port_mode_mappings_in_process(tmp_path):
    code = """
        import json, torch
        import torch_vnpu.port.cuda as port
        facts = {}
        facts["factory"] = torch.ones(2, device="cuda:1").device.type + str(torch.ones(2, device="cuda:1").device.index)
        facts["device_obj"] = torch.zeros(1, device=torch.device("cuda")).device.type
        facts["to"] = torch.ones(1).to("cuda").device.type
        facts["to_obj"] = torch.ones(1).to(torch.device("cuda", 1)).device.index
        facts["tensor_cuda"] = str(torch.ones(1).cuda(1).device)
        facts["module_cuda"] = next(torch.nn.Linear(2, 2).cuda().parameters()).device.type
        facts["module_to"] = next(torch.nn.Linear(2, 2).to("cuda").parameters()).device.type
        facts["like"] = torch.empty_like(torch.ones(1), device="cuda").device.type
        facts["count"] = torch.cuda.device_count() == torch.vnpu.device_count()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.ones(3, device="cuda") * 2
        torch.cuda.synchronize()
        facts["stream"] = s.device.type
        torch.cuda.manual_seed(3); a = torch.randn(3, device="cuda")
        torch.cuda.manual_seed(3); b = torch.randn(3, device="cuda")
        facts["seed"] = bool((a == b).all())
        with torch.autocast("cuda", dtype=torch.bfloat16):
            facts["autocast"] = str((torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")).dtype)
        with torch.cuda.amp.autocast(dtype=torch.float16):
            facts["cuda_amp_autocast"] = str(torch.nn.functional.linear(torch.ones(2, 2).cuda(), torch.ones(2, 2).cuda()).dtype)
        facts["scaler"] = torch.amp.GradScaler("cuda")._device
        torch.save(torch.arange(3), "t.pt")
        facts["load"] = torch.load("t.pt", map_location="cuda").device.type
        facts["alloc"] = torch.cuda.memory_allocated() == torch.vnpu.memory_allocated() > 0
        facts["string_compare"] = torch.ones(1, device="cuda").device.type == "cuda"
        facts["torch_internal_sees_real_cuda"] = torch.cuda.amp.common.amp_definitely_not_available()
        torch.cuda.set_sync_debug_mode("warn")
        facts["sync_debug_mode"] = [torch.vnpu.get_sync_debug_mode(), torch.cuda.get_sync_debug_mode()]
        torch.cuda.set_sync_debug_mode(0)
        torch.cuda.set_per_process_memory_fraction(0.5, "cuda:0")  # CUDA device arguments map to vnpu
        facts["memory_fraction"] = [torch.vnpu.get_per_process_memory_fraction(),
                                    torch.cuda.memory.get_per_process_memory_fraction(torch.device("cuda", 0))]
        facts["peer"] = torch.cuda.can_device_access_peer(0, 1) == (torch.vnpu.device_count() > 1)
        facts["host_memory_stats"] = "num_host_alloc" in torch.cuda.host_memory_stats()
        print(json.dumps(facts))
    """
    proc = _run(["-c", textwrap.dedent(code)], tmp_path)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts == {
        "factory": "vnpu1", "device_obj": "vnpu", "to": "vnpu", "to_obj": 1, "tensor_cuda": "vnpu:1",
        "module_cuda": "vnpu", "module_to": "vnpu", "like": "vnpu", "count": True, "stream": "vnpu", "seed": True,
        "autocast": "torch.bfloat16", "cuda_amp_autocast": "torch.float16", "scaler": "vnpu", "load": "vnpu",
        "alloc": True, "string_compare": False, "torch_internal_sees_real_cuda": True, "sync_debug_mode": [1, 1],
        "memory_fraction": [0.5, 0.5], "host_memory_stats": True, "peer": True,
    }


def test_cuda_only_features_map_to_vnpu_equivalents(tmp_path):
    """torch.Generator(device="cuda"), CUDA's typed tensor classes, CUDA graphs and nvtx ranges under port mode;
    oracles: the same calls written for vnpu, and the graph's eager computation. After disable(), torch's own."""
    code = """
        import json, torch
        import torch_vnpu.port.cuda as port
        from torch.profiler import profile
        facts = {}
        g = torch.Generator(device="cuda")
        g.manual_seed(3)
        ref = torch.Generator("vnpu").manual_seed(3)
        facts["generator"] = [str(g.device), isinstance(g, torch.Generator), isinstance(ref, torch.Generator),
                              torch.equal(torch.randn(5, generator=g, device="cuda").cpu(),
                                          torch.randn(5, generator=ref, device="vnpu").cpu())]
        y = torch.arange(3).type(torch.cuda.FloatTensor)
        z = torch.ones(2, dtype=torch.float64).type("torch.cuda.HalfTensor")
        facts["typed"] = [str(y.device), str(y.dtype), y.tolist(), str(z.dtype), isinstance(y, torch.cuda.FloatTensor),
                          isinstance(y, torch.cuda.LongTensor), str(torch.ones(1).type(torch.float64).dtype),
                          list(torch.cuda.FloatTensor(2, 3).shape), torch.cuda.LongTensor([4, 5]).tolist(),
                          str(torch.cuda.LongTensor([4, 5]).device)]
        a = torch.zeros(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            b = a * 2 + 1  # warm-up, as CUDA graphs want
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph):
            b = a * 2 + 1
        a.fill_(3.0)
        graph.replay()
        facts["graph"] = [type(graph).__name__, b.tolist()]
        with profile() as prof:
            torch.cuda.nvtx.range_push("step")
            torch.cuda.nvtx.mark("marker")
            with torch.cuda.nvtx.range("inner {}", 1):
                (a + 1).sum()
            depth = torch.cuda.nvtx.range_pop()
        facts["nvtx"] = [depth, sorted({e.name for e in prof.events()} & {"step", "marker", "inner 1"})]
        port.disable()
        facts["after_disable"] = [torch.Generator is torch._C.Generator, torch.cuda.CUDAGraph.__name__]
        try:
            torch.cuda.nvtx.range_push("x")
            facts["nvtx_after"] = "no error"
        except RuntimeError as e:
            facts["nvtx_after"] = "NVTX" in str(e)
        print(json.dumps(facts))
    """
    proc = _run(["-c", textwrap.dedent(code)], tmp_path)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts == {
        "generator": ["vnpu:0", True, True, True],
        "typed": ["vnpu:0", "torch.float32", [0.0, 1.0, 2.0], "torch.float16", True, False, "torch.float64",
                  [2, 3], [4, 5], "vnpu:0"],
        "graph": ["VNPUGraph", [7.0] * 4],
        "nvtx": [0, ["inner 1", "marker", "step"]],
        "after_disable": [True, "CUDAGraph"],
        "nvtx_after": True,
    }, facts


def test_cuda_call_without_port_mode_names_port_mode(tmp_path):
    code = """
        import torch
        try:
            torch.ones(2).cuda()
        except AssertionError as e:
            print(e)
    """
    out = _run(["-c", textwrap.dedent(code)], tmp_path).stdout
    assert out.startswith("Torch not compiled with CUDA enabled") and "python -m torch_vnpu.port.run" in out, out


def test_port_mode_profiler_and_memory_history_record_vnpu(tmp_path):
    # A CUDA script's profiler (ProfilerActivity.CUDA) and memory history (torch.cuda.memory.*) see vnpu's
    # device activity and allocator, as they would see the GPU's; the oracle is the same calls made with
    # torch.vnpu / ProfilerActivity.PrivateUse1 directly.
    code = """
        import json, pickle, torch
        import torch_vnpu.port.cuda as port
        from torch.profiler import profile, ProfilerActivity
        dev = torch.autograd.DeviceType.PrivateUse1
        x = torch.randn(64, 64, device="cuda")
        facts = {}
        torch.cuda.memory._record_memory_history(max_entries=1000)
        for name, acts in (("cuda", [ProfilerActivity.CPU, ProfilerActivity.CUDA]),
                           ("cuda_only", [ProfilerActivity.CUDA]),
                           ("both", [ProfilerActivity.CUDA, ProfilerActivity.PrivateUse1]),
                           ("vnpu", [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])):
            with profile(activities=acts) as p:
                y = (x @ x).relu()
                torch.cuda.synchronize()
            facts[name] = sorted(e.name for e in p.events() if e.device_type == dev)
        y = torch.ones(1000, device="cuda")  # 4000 bytes, one block
        snap = torch.cuda.memory._snapshot()
        facts["snapshot_has_block"] = any(b["requested_size"] == 4000 and b["state"] == "active_allocated"
                                          for seg in snap["segments"] for b in seg["blocks"])
        facts["traces"] = sum(len(t) for t in snap["device_traces"]) > 0
        torch.cuda.memory._dump_snapshot("snap.pickle")
        with open("snap.pickle", "rb") as f:
            facts["dump_segments"] = len(pickle.load(f)["segments"]) == len(torch.vnpu.memory._snapshot()["segments"])
        facts["memory_allocated"] = torch.cuda.memory.memory_allocated() == torch.vnpu.memory_allocated() > 0
        print(json.dumps(facts))
    """
    proc = _run(["-c", textwrap.dedent(code)], tmp_path)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["vnpu"] == ["aten::mm", "aten::relu"], facts
    assert facts["cuda"] == facts["cuda_only"] == facts["both"] == facts["vnpu"], facts
    assert facts["snapshot_has_block"] and facts["traces"] and facts["dump_segments"] and facts["memory_allocated"]


def test_port_mode_refuses_to_start_without_vnpu(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import torch\nprint('RAN', torch.ones(1, device='cuda'))\n")
    proc = _run(["-m", "torch_vnpu.port.run", str(script)], tmp_path, env={"VNPU_VISIBLE_DEVICES": ""},
                expect_ok=False)
    assert proc.returncode == 1 and "RAN" not in proc.stdout
    assert "no vnpu device is available" in proc.stderr and "CPU" in proc.stderr
    proc = _run(["-c", "import torch_vnpu.port.cuda"], tmp_path, env={"VNPU_VISIBLE_DEVICES": ""}, expect_ok=False)
    assert proc.returncode == 1 and "RuntimeError: torch_vnpu port mode: no vnpu device is available" in proc.stderr


def test_check_lists_cuda_calls_with_replacements(tmp_path):
    findings = check.check_source(open(os.path.join(SCRIPTS, "nanogpt_cuda.py")).read(), "nanogpt_cuda.py")
    text = "\n".join(map(str, findings))
    lines = {f.line for f in findings}
    src = open(os.path.join(SCRIPTS, "nanogpt_cuda.py")).read().splitlines()
    expected = {i + 1 for i, l in enumerate(src) if "cuda" in l and not l.lstrip().startswith(("#", '"""'))
                and "dtype ==" not in l and i > 10}
    assert expected <= lines, (expected - lines, text)
    assert "torch.amp.GradScaler(device.type)" in text and "torch.get_device_module(device).is_bf16_supported()" in text
    assert "torch.accelerator.is_available()" in text and "torch.accelerator.synchronize()" in text
    assert "a string compare with 'cuda'" in text and "cuDNN/CUDA setting" in text
    mnist = check.check_source("x = data.cuda()\ny = torch.device('cuda:1')\nz = torch.cuda.Stream()\n", "m.py")
    assert [(f.line, f.replacement.split()[0]) for f in mnist] == [
        (1, ".to(device)"), (2, "torch.accelerator.current_accelerator()"), (3, "torch.Stream(device)")]
    assert check.check_source("device = torch.accelerator.current_accelerator()\n") == []
    proc = _run(["-m", "torch_vnpu.port.check", os.path.join(SCRIPTS, "mnist_cuda.py")], tmp_path, expect_ok=False)
    assert proc.returncode == 1 and "mnist_cuda.py:" in proc.stdout and "hard-coded CUDA use(s) found" in proc.stdout


ALIASED = '''\
import torch
import torch as th
import torch.cuda as tc
from torch import cuda
from torch.cuda import amp
from torch.cuda.amp import GradScaler, autocast as cuda_autocast
import lightning as L

scaler = GradScaler(enabled=True)
cuda.synchronize()
tc.manual_seed(0)
with cuda_autocast(dtype=torch.bfloat16):
    n = th.cuda.device_count()
s2 = amp.GradScaler()
trainer = L.Trainer(accelerator="gpu", devices=1)
fabric = L.Fabric(accelerator="cuda")
device = torch.accelerator.current_accelerator()
'''


def test_check_resolves_aliased_imports():
    findings = check.check_source(ALIASED, "a.py")
    got = {(f.line, f.code): f.replacement for f in findings}
    assert set(got) == {
        (3, "import torch.cuda as tc"), (4, "from torch import cuda"), (5, "from torch.cuda import amp"),
        (6, "from torch.cuda.amp import GradScaler, autocast as cuda_autocast"),
        (9, "GradScaler"), (10, "cuda.synchronize"), (11, "tc.manual_seed"), (12, "cuda_autocast"),
        (13, "th.cuda.device_count"), (14, "amp.GradScaler"), (15, '"gpu"'), (16, '"cuda"'),
    }, "\n".join(map(str, findings))
    assert got[9, "GradScaler"] == got[14, "amp.GradScaler"] == "torch.amp.GradScaler(device.type)"
    assert got[10, "cuda.synchronize"] == "torch.accelerator.synchronize()"
    assert got[11, "tc.manual_seed"].startswith("torch.manual_seed(seed)")
    assert got[12, "cuda_autocast"] == "torch.autocast(device.type, dtype=...)"
    assert got[13, "th.cuda.device_count"] == "torch.accelerator.device_count()"
    assert "cuda_autocast: torch.autocast(device.type" in got[6, "from torch.cuda.amp import GradScaler, autocast as cuda_autocast"]
    assert got[15, '"gpu"'].startswith("accelerator='auto'") and got[16, '"cuda"'] == got[15, '"gpu"']
    # Names bound to something else than torch.cuda are left alone.
    assert check.check_source("from torch.amp import GradScaler\nscaler = GradScaler('vnpu')\n") == []
    assert check.check_source("import numpy as cuda\ncuda.synchronize()\nL.Trainer(accelerator='cpu')\n") == []


STAR_AND_MORE = '''import os
import torch
import torch.distributed as dist
from torch.cuda.amp import *
os.environ["CUDA_VISIBLE_DEVICES"] = "0"
dist.init_process_group("nccl")
dist.init_process_group(backend="gloo")
scaler = GradScaler()
with autocast():
    x = torch.cuda.FloatTensor(3)
torch.cuda.nvtx.range_push("a")
g = torch.cuda.CUDAGraph()
'''


def test_check_star_imports_backends_env_and_cuda_only_classes():
    got = {(f.line, f.code): f.replacement for f in check.check_source(STAR_AND_MORE, "b.py")}
    assert set(got) == {
        (4, "from torch.cuda.amp import *"), (5, '"CUDA_VISIBLE_DEVICES"'), (6, '"nccl"'), (8, "GradScaler"),
        (9, "autocast"), (10, "torch.cuda.FloatTensor"), (11, "torch.cuda.nvtx.range_push"),
        (12, "torch.cuda.CUDAGraph"),
    }, got
    assert got[8, "GradScaler"] == "torch.amp.GradScaler(device.type)"
    assert "VNPU_VISIBLE_DEVICES" in got[5, '"CUDA_VISIBLE_DEVICES"']
    # The suggested replacements exist on this device (not CUDA-only names under torch.get_device_module).
    assert torch.distributed.get_default_backend_for_device("vnpu") == "vccl" and "vccl" in got[6, '"nccl"']
    assert got[10, "torch.cuda.FloatTensor"].startswith("torch.tensor(")
    assert got[11, "torch.cuda.nvtx.range_push"].startswith("torch.profiler.record_function")
    assert "torch.accelerator.Graph()" in got[12, "torch.cuda.CUDAGraph"]
    assert hasattr(torch.accelerator, "Graph") and hasattr(torch.vnpu, "VNPUGraph")


COMPUTED = '''import torch
rank = 1
a = f"cuda:{rank}"
b = "cuda:" + str(rank)
c = "cuda:%d" % rank
d = "cuda:{}".format(rank)
dev = torch.device(f"cuda:{local_rank}")
same = str(x.device) == f"cuda:{rank}"
e = "cuda" + ":" + str(rank)
not_devices = (f"cpu:{rank}", "cudagraphs", f"{rank}cuda", "x:" + str(rank))
'''


def test_check_reports_computed_device_strings():
    got = {(f.line, f.code): f.replacement for f in check.check_source(COMPUTED, "c.py")}
    assert set(got) == {(3, 'f"cuda:{rank}"'), (4, '"cuda:" + str(rank)'), (5, '"cuda:%d" % rank'),
                        (6, '"cuda:{}".format(rank)'), (7, 'torch.device(f"cuda:{local_rank}")'),
                        (8, 'str(x.device) == f"cuda:{rank}"'), (9, '"cuda" + ":" + str(rank)')}, got
    assert "device_type = torch.accelerator.current_accelerator().type" in got[3, 'f"cuda:{rank}"']
    assert "torch.device('cuda', i) object" in got[7, 'torch.device(f"cuda:{local_rank}")']


NCCL_USES = '''import torch.distributed as dist
from torch.distributed import Backend
g = dist.new_group([0, 1], backend="cpu:gloo,cuda:nccl")
s = dist.new_subgroups(backend="nccl")
ok = dist.is_nccl_available()
same = dist.get_backend() == "nccl"
b = Backend.NCCL
fine = dist.new_group([0], backend="gloo")
'''


def test_check_reports_nccl_uses_beyond_init_process_group():
    got = {(f.line, f.code): f.replacement for f in check.check_source(NCCL_USES, "n.py")}
    assert set(got) == {(3, '"cpu:gloo,cuda:nccl"'), (4, '"nccl"'), (5, "dist.is_nccl_available()"),
                        (6, 'dist.get_backend() == "nccl"'), (7, "Backend.NCCL")}, got
    assert "get_default_backend_for_device" in got[6, 'dist.get_backend() == "nccl"']


def test_check_unparsable_file_reports_only_the_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = torch.cuda.synchronize(\n")
    proc = _run(["-m", "torch_vnpu.port.check", str(bad)], tmp_path, expect_ok=False)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(f"{bad}:1:") and "cannot check: SyntaxError:" in proc.stderr
    good = tmp_path / "good.py"
    good.write_text("import torch\n")
    proc = _run(["-m", "torch_vnpu.port.check", str(tmp_path)], tmp_path, expect_ok=False)
    assert proc.returncode == 2 and "nothing to change" not in proc.stdout
    assert "in the 1 file(s) checked; 1 file(s) could not be checked" in proc.stdout


def test_port_run_missing_script_or_module_as_python(tmp_path):
    missing = tmp_path / "missing.py"
    python = _run([str(missing)], tmp_path, expect_ok=False)  # the oracle: python's own message and status
    proc = _run(["-m", "torch_vnpu.port.run", "missing.py"], tmp_path, expect_ok=False)
    assert proc.returncode == python.returncode == 2
    assert proc.stderr.strip() == "torch_vnpu.port.run: " + python.stderr.strip().split(": ", 1)[1]
    assert "Traceback" not in proc.stderr
    python = _run(["-m", "no_such_module_xyz"], tmp_path, expect_ok=False)
    proc = _run(["-m", "torch_vnpu.port.run", "-m", "no_such_module_xyz"], tmp_path, expect_ok=False)
    assert proc.returncode == python.returncode == 1
    assert proc.stderr.strip() == "torch_vnpu.port.run: " + python.stderr.strip().split(": ", 1)[1]
