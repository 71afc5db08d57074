"""Hugging Face multi-process on vnpu: accelerate with its DDP and FSDP2 plugins, and the transformers `Trainer`
(DDP and FSDP2), with 2 ranks under torchrun or `accelerate launch` through torch_vnpu.integrations.huggingface,
each against one process training the same global batch (tests/hf_dist_job.py: tiny random-init Llama,
nothing downloaded).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, PartialState  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402

import torch_vnpu.integrations.huggingface as hf_vnpu  # noqa: E402
from torch_vnpu.testing.distributed import free_port  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_dist_job.py")
sys.path.insert(0, os.path.dirname(JOB))
import hf_dist_job  # noqa: E402

# float32. DDP/FSDP2 sum the two ranks' gradients in vccl, one process sums all rows in one kernel (and with
# more OpenMP threads): a different reduction order. Measured: losses within 1.2e-7 relative, final
# parameters within 8.2e-7 absolute (3 AdamW steps, lr 5e-3: they moved by > 1e-2).
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-5
TIMEOUT = 300  # seconds per launch (each took 25-45 s on the loaded 2-core machine)

_TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
_ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no"]
_ACCELERATE_FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
                     "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer", "--fsdp_state_dict_type",
                     "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true"]

CASES = {  # name: (launcher, launcher arguments, job arguments, expected distributed type)
    # accelerate's own launcher, DDP; gradient accumulation (DDP's no_sync inside Accelerator.accumulate)
    "accelerate-ddp": ("accelerate", ["--multi_gpu"], ["--job", "accelerate", "--grad-accum", "2"], "MULTI_GPU"),
    # FSDP2 configured by the launcher (what `accelerate config` writes), the script unchanged
    "accelerate-fsdp2-launch": ("accelerate", _ACCELERATE_FSDP2, ["--job", "accelerate"], "FSDP"),
    # FSDP2 plugin built in the script, under torchrun
    "accelerate-fsdp2": ("torchrun", [], ["--job", "accelerate", "--fsdp2"], "FSDP"),
    "trainer-ddp": ("torchrun", [], ["--job", "trainer"], "MULTI_GPU"),
    "trainer-fsdp2": ("torchrun", [], ["--job", "trainer", "--fsdp2"], "FSDP"),  # fsdp_config version 2
}

_references: dict = {}


def _reference(job_args: list, tmp_path_factory) -> tuple[dict, dict]:
    """The single-process run of the same global batch (in this process, adapter enabled); FSDP2 or not, the
    reference is the plain model on one device."""
    key = tuple(a for a in job_args if a != "--fsdp2")
    if key not in _references:
        out = tmp_path_factory.mktemp("reference")
        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            with hf_vnpu.enabled(), torch.random.fork_rng(devices=[0], device_type="vnpu"):
                result = hf_dist_job.main([*key, "--out", str(out)])
                initial = hf_dist_job.tiny_llama().state_dict()
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
        assert result["world_size"] == 1 and result["distributed_type"] == "NO", result
        _references[key] = (result, torch.load(out / "params.pt"), initial)
    return _references[key]


def _launch(launcher: str, launcher_args: list, job_args: list, out) -> subprocess.CompletedProcess:
    port = ["--master-port", str(free_port())] if launcher == "torchrun" else ["--main_process_port", str(free_port())]
    base = _TORCHRUN if launcher == "torchrun" else _ACCELERATE
    cmd = [*base, *port, *launcher_args, "-m", "torch_vnpu.integrations.huggingface", JOB, *job_args, "--out", str(out)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


# The default run keeps one DDP and one FSDP2 launch; the others are `make test-slow`.
@pytest.mark.parametrize("case", [c if c in ("trainer-ddp", "accelerate-fsdp2") else pytest.param(c, marks=pytest.mark.slow)
                                  for c in CASES])
def test_two_ranks_match_one_process(case, tmp_path, tmp_path_factory):
    launcher, launcher_args, job_args, distributed_type = CASES[case]
    ref, ref_params, initial = _reference(job_args, tmp_path_factory)
    _launch(launcher, launcher_args, job_args, tmp_path)
    result = json.loads((tmp_path / "result.json").read_text())
    print(case, "one process", ref["losses"], "2 ranks", result["losses"])

    # accelerate recognised the launch: vccl for vnpu tensors (gloo for cpu), rank 0 on vnpu:0, the model wrapped
    assert result["world_size"] == 2 and result["distributed_type"] == distributed_type
    assert result["backend"] == "cpu:gloo,vnpu:vccl"
    assert result["device"] == "vnpu:0" and result["param_devices"] == ["vnpu:0"]
    if distributed_type == "MULTI_GPU":
        assert result["model_type"] == "DistributedDataParallel" and result["param_types"] == ["Tensor"]
    else:
        assert result["model_type"].startswith("FSDP") and result["param_types"] == ["DTensor"]  # fully_shard

    assert len(result["losses"]) == len(ref["losses"]) > 0
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(ref["losses"]), rtol=LOSS_RTOL, atol=0)
    assert result["losses"][-1] < result["losses"][0]

    params = torch.load(tmp_path / "params.pt")  # full state dict, gathered from the shards for FSDP2
    assert params.keys() == ref_params.keys()
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=PARAM_ATOL, msg=lambda m: f"{name}: {m}")
    moved = max((params[k] - initial[k]).abs().max().item() for k in params)
    assert moved > 100 * PARAM_ATOL, moved  # training moved the parameters far beyond the tolerance


def _prepare_backend(**kwargs):
    # _prepare_backend reads only its arguments and the environment; no process group is created
    return PartialState._prepare_backend(object.__new__(PartialState), **kwargs)


def test_backend_selection_under_torchrun(monkeypatch):
    """What accelerate's PartialState picks with LOCAL_RANK set (torchrun), with and without the adapter."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert hf_vnpu.is_enabled()  # switched on by `import accelerate` (torch_vnpu.integrations)
    hf_vnpu.disable()
    assert _prepare_backend() == (None, DistributedType.NO)  # accelerate alone: not distributed at all
    with hf_vnpu.enabled():
        assert _prepare_backend() == ("cpu:gloo,vnpu:vccl", DistributedType.MULTI_GPU)
        assert _prepare_backend(backend="vccl") == ("vccl", DistributedType.MULTI_GPU)  # a named backend is kept
        assert _prepare_backend(cpu=True) == ("gloo", DistributedType.MULTI_CPU)  # CPU request still wins
    monkeypatch.delenv("LOCAL_RANK")
    with hf_vnpu.enabled():
        assert _prepare_backend() == (None, DistributedType.NO)  # one process: untouched
    hf_vnpu.enable()  # as the rest of the session had it
