"""Library adapters switch themselves on when the library is imported (torch_vnpu.integrations._autoload);
VNPU_INTEGRATIONS turns them off. Each case runs in a fresh interpreter, as a user's script would."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from torch_vnpu.integrations import _autoload

pytest.importorskip("accelerate")


def _run(code: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("VNPU_INTEGRATIONS", "ACCELERATE_TORCH_DEVICE")}
    full_env.update(env or {})
    full_env.setdefault("HF_HUB_OFFLINE", "1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _last_json(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_env_parsing():
    assert _autoload.enabled_adapters("") == {"huggingface", "lightning"}
    assert _autoload.enabled_adapters("1") == _autoload.enabled_adapters("all") == {"huggingface", "lightning"}
    assert _autoload.enabled_adapters("0") == _autoload.enabled_adapters("off") == set()
    assert _autoload.enabled_adapters("-huggingface") == {"lightning"}
    assert _autoload.enabled_adapters("huggingface") == {"huggingface"}
    assert _autoload.enabled_adapters("huggingface,-huggingface") == set()
    with pytest.warns(UserWarning, match="unknown adapter.*'nope'.*known"):
        assert _autoload.enabled_adapters("huggingface,nope") == {"huggingface"}


IMPORT_ONLY = """
    import sys, json, torch
    print(json.dumps({"loaded": sorted(m for m in sys.modules if m.startswith(("torch_vnpu.integrations.",
        "accelerate", "transformers", "peft", "lightning"))),
        "hook": any(type(f).__name__ == "_Finder" for f in sys.meta_path)}))
"""


def test_import_torch_imports_no_adapter_and_no_library():
    out = _last_json(_run(IMPORT_ONLY))
    assert out == {"loaded": ["torch_vnpu.integrations._autoload"], "hook": True}
    out = _last_json(_run(IMPORT_ONLY, {"VNPU_INTEGRATIONS": "0"}))
    assert out == {"loaded": ["torch_vnpu.integrations._autoload"], "hook": False}


ACCELERATE = """
    import json, logging, sys
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(message)s")
    import accelerate                       # first import: accelerate imports torch, which loads torch_vnpu
    from accelerate import Accelerator
    import torch
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(4, 2))
    print(json.dumps({"device": str(acc.device), "param": next(model.parameters()).device.type}))
"""


def test_plain_import_accelerate_picks_vnpu_and_logs_each_patch_once():
    proc = _run(ACCELERATE)
    assert _last_json(proc) == {"device": "vnpu", "param": "vnpu"}
    lines = [l for l in proc.stderr.splitlines() if l.startswith("torch_vnpu.integrations")]
    patched = [l for l in lines if "patched accelerate.state.PartialState.default_device" in l]
    assert len(patched) == 1, lines
    assert len(lines) == len(set(lines)), lines  # each patch once


@pytest.mark.parametrize("value", ["0", "-huggingface"])
def test_vnpu_integrations_off_leaves_accelerate_on_cpu(value):
    proc = _run(ACCELERATE, {"VNPU_INTEGRATIONS": value})
    assert _last_json(proc) == {"device": "cpu", "param": "cpu"}
    assert "patched" not in proc.stderr


TRAINER = """
    import json, tempfile, torch
    from transformers import Trainer, TrainingArguments

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}

    torch.manual_seed(0)
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(8)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=4,
                             report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1)
    trainer = Trainer(model=Net(), args=args, train_dataset=data)
    trainer.train()
    print(json.dumps({"device": str(args.device), "params": sorted({p.device.type for p in trainer.model.parameters()}),
                      "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}))
"""


# Two Trainer runs in fresh interpreters (~32 s): `make test-slow`.
@pytest.mark.slow
def test_plain_trainer_picks_vnpu_and_matches_integrations_off_on_cpu():
    on = _last_json(_run(TRAINER))
    off = _last_json(_run(TRAINER, {"VNPU_INTEGRATIONS": "0"}))
    assert on["device"].startswith("vnpu") and on["params"] == ["vnpu"]
    assert off["device"] == "cpu" and off["params"] == ["cpu"]
    assert len(on["losses"]) == 2 and on["losses"] == pytest.approx(off["losses"], rel=1e-6)


def test_unknown_version_is_left_alone_with_one_warning():
    proc = _run("""
        import json, warnings
        warnings.simplefilter("always")
        import torch_vnpu.integrations.huggingface as hf
        hf.TESTED_VERSIONS["accelerate"] = "0.1"      # as if the installed accelerate were unknown
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import accelerate
            from accelerate import Accelerator
            device = Accelerator().device
        msgs = [str(w.message) for w in caught if "vnpu adapter knows" in str(w.message)]
        print(json.dumps({"device": str(device), "msgs": msgs, "version": accelerate.__version__,
                          "patched": hf.patched_names()}))
    """)
    out = _last_json(proc)
    assert out["device"] == "cpu"
    assert len(out["msgs"]) == 1 and f"accelerate {out['version']} is not a version" in out["msgs"][0]
    # accelerate's own patches are left out; safetensors' patch rebinds `safe_open` in every module that imported
    # it by name, accelerate's included (that one is safetensors', whose version is known).
    assert not any(n.startswith("accelerate") and not n.endswith(".safe_open") for n in out["patched"]), out
