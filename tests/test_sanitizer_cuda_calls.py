"""VNPU_SANITIZE check 5 (issue #12): hard-coded CUDA reached from a program running on vnpu is reported once per
call site, with the file, the line and the device-agnostic replacement.

The program that is wrong without the sanitizer is tests/port_scripts/nanogpt_cuda.py run with --device=vnpu
(nanoGPT's train.py shape): it trains, but silently without autocast, pinned batches, fused AdamW or a working
GradScaler, because its CUDA tests answer False. The fixed program (torch.accelerator / torch.amp) runs clean."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
NANOGPT = os.path.join(HERE, "port_scripts", "nanogpt_cuda.py")


def _run(args, tmp_path, sanitize=True, extra_env=None):
    env = dict(os.environ, PYTHONWARNINGS="always")
    env.pop("VNPU_SANITIZE", None)
    if sanitize:
        env["VNPU_SANITIZE"] = "1"
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _reports(stderr):
    """(file, line, message) of every CudaCallWarning in stderr."""
    out = []
    for line in stderr.splitlines():
        if ": CudaCallWarning: " in line:
            where, message = line.split(": CudaCallWarning: ", 1)
            path, lineno = where.rsplit(":", 1)
            out.append((path, int(lineno), message))
    return out


def test_nanogpt_written_for_cuda_is_silently_degraded_and_each_cause_is_reported_once(tmp_path):
    proc = _run([NANOGPT, "--device=vnpu", f"--out={tmp_path / 'r.json'}"], tmp_path)
    facts = json.loads((tmp_path / "r.json").read_text())
    # Wrong without being told: it trained on vnpu, but with every CUDA feature switched off.
    assert facts["param_devices"] == ["vnpu"]
    assert facts["device_type"] == "cpu" and not facts["fused"] and not facts["scaler_enabled"]
    assert facts["logits_dtype"] == "torch.float32" and "pinned" not in facts
    reports = _reports(proc.stderr)
    source = open(NANOGPT).read().splitlines()
    by_line = {line: msg for path, line, msg in reports if os.path.samefile(path, NANOGPT)}
    assert len(by_line) == len(reports), reports  # nothing reported outside the script
    flagged = {source[line - 1].strip() for line in by_line}
    for expected in ('device_type = "cuda" if "cuda" in device else "cpu"',
                     'dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"',
                     'scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))',
                     'use_fused = fused_available and device_type == "cuda"',
                     'if device_type == "cuda":'):
        assert expected in flagged, (expected, sorted(flagged))
    gradscaler = next(m for line, m in by_line.items() if "GradScaler(" in source[line - 1])
    assert 'torch.amp.GradScaler(device.type)' in gradscaler
    compare = next(m for line, m in by_line.items() if '"cuda" in device' in source[line - 1])
    assert "torch.accelerator.current_accelerator().type" in compare
    assert len(reports) == len({(p, n) for p, n, _ in reports})  # once per call site


FIXED = textwrap.dedent("""
    import torch
    device = torch.accelerator.current_accelerator()
    model = torch.nn.Linear(8, 8).to(device)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    scaler = torch.amp.GradScaler(device.type)
    dtype = torch.bfloat16 if torch.get_device_module(device).is_bf16_supported() else torch.float16
    x = torch.randn(4, 8).pin_memory().to(device, non_blocking=True)
    for _ in range(3):
        with torch.autocast(device.type, dtype=dtype):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    torch.accelerator.synchronize()
    assert device.type == "vnpu" and x.device.type == device.type
    print("ok", loss.item())
""")


def test_the_device_agnostic_program_runs_clean(tmp_path):
    (tmp_path / "fixed.py").write_text(FIXED)
    proc = _run(["fixed.py"], tmp_path)
    assert "ok" in proc.stdout
    assert _reports(proc.stderr) == []


def test_repeated_calls_report_once_and_torch_internal_calls_are_not_reported(tmp_path):
    (tmp_path / "loop.py").write_text(textwrap.dedent("""
        import torch
        for _ in range(50):
            torch.cuda.is_available()            # line 4: one report
        with torch.autocast("vnpu"):             # torch's own checks of CUDA: not the user's
            torch.ones(2, device="vnpu") @ torch.ones(2, device="vnpu")
        from torch_vnpu.sanitizer import cuda_calls
        print(len(cuda_calls.reports()))
    """))
    proc = _run(["loop.py"], tmp_path)
    assert [(os.path.basename(p), n) for p, n, _ in _reports(proc.stderr)] == [("loop.py", 4)]
    assert proc.stdout.strip() == "1"


def test_is_cuda_read_on_a_vnpu_tensor_in_an_imported_module_is_reported(tmp_path):
    # The main script mentions no CUDA (its static scan finds nothing); the imported helper's `x.is_cuda` is
    # False on vnpu and silently picks the slow path: reported at run time (the second break test found it
    # unreported). On a CPU tensor it is right, not reported; torch's own reads are not the user's.
    (tmp_path / "kernels.py").write_text(textwrap.dedent("""
        def pick(x):
            return "fused" if x.is_cuda else "reference"   # line 3
    """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import torch, kernels
        print(kernels.pick(torch.ones(2)), kernels.pick(torch.ones(2, device="vnpu")))
        torch.optim.AdamW([torch.nn.Parameter(torch.ones(2, device="vnpu"))]).step()
        from torch_vnpu.sanitizer import cuda_calls
        cuda_calls.uninstall()
        print(type(torch.Tensor.__dict__.get("is_cuda")).__name__, torch.ones(1, device="vnpu").is_cuda)
    """))
    proc = _run(["main.py"], tmp_path)
    assert [(os.path.basename(p), n) for p, n, _ in _reports(proc.stderr)] == [("kernels.py", 3)]
    assert "x.device.type == device.type" in proc.stderr
    assert proc.stdout.split() == ["reference", "reference", "NoneType", "False"]


def test_torchs_own_disabling_warnings_stay_on_the_users_line(tmp_path):
    # Before: the wrappers moved torch's "CUDA is not available ... Disabling" warnings onto their own line.
    (tmp_path / "amp.py").write_text(textwrap.dedent("""
        import torch
        scaler = torch.cuda.amp.GradScaler()     # line 3
        with torch.autocast("cuda"):             # line 4
            pass
    """))
    proc = _run(["amp.py"], tmp_path)
    disabling = [ln for ln in proc.stderr.splitlines() if "Disabling" in ln]
    assert len(disabling) == 2, proc.stderr[-3000:]
    assert disabling[0].startswith(str(tmp_path / "amp.py") + ":3: UserWarning"), disabling
    assert disabling[1].startswith(str(tmp_path / "amp.py") + ":4: UserWarning"), disabling
    assert "cuda_calls.py" not in proc.stderr


def test_autocast_state_read_for_cuda_is_reported_and_class_names_as_written(tmp_path):
    # Found by the third break test: torch.get_autocast_dtype("cuda") inside a vnpu autocast region answers
    # CUDA's state (float16), not the region's, unreported; `x.is_cuda` on a CPU tensor in the main script was
    # reported by the static scan (False is right there); torch.autocast("cuda") was named torch.cuda.amp's.
    (tmp_path / "state.py").write_text(textwrap.dedent("""
        import torch
        print(torch.ones(2).is_cuda)
        with torch.autocast("vnpu", dtype=torch.bfloat16):
            print(torch.get_autocast_dtype("cuda"), torch.is_autocast_enabled("cuda"))   # line 5
            print(torch.get_autocast_dtype("vnpu"), torch.is_autocast_enabled("vnpu"))
        with torch.autocast("cuda"):                                                     # line 7
            pass
        torch.cuda.amp.GradScaler()                                                      # line 9
        with torch.autocast("vnpu", dtype=torch.bfloat16):
            print(torch.is_autocast_enabled())                                           # line 11
            print(torch.get_autocast_gpu_dtype())                                        # line 12
    """))
    proc = _run(["state.py"], tmp_path)
    assert proc.stdout.split() == ["False", "torch.float16", "False", "torch.bfloat16", "True", "False",
                                   "torch.float16"]
    reports = [(n, m) for _, n, m in _reports(proc.stderr)]
    # Lines 11-12: the pre-2.4 spellings of CUDA's autocast state (found by the fourth break test).
    assert [n for n, _ in reports] == [5, 7, 9, 11, 12], reports
    assert "torch.is_autocast_enabled() --" in reports[3][1] and "torch.get_autocast_gpu_dtype() --" in reports[4][1]
    assert 'torch.get_autocast_dtype("cuda")' in reports[0][1]
    assert 'torch.get_autocast_dtype(device.type)' in reports[0][1]
    assert reports[1][1].startswith('hard-coded CUDA in a program running on vnpu: torch.autocast("cuda") --')
    assert reports[2][1].startswith("hard-coded CUDA in a program running on vnpu: torch.cuda.amp.GradScaler() --")


def test_code_without_a_source_file_is_reported_and_keeps_running(tmp_path):
    # Found by the third break test: from `python -c`, stdin or exec the report raised ImportError inside the
    # warning machinery (the loader of __main__ has no source) and killed the program.
    code = "import torch\nprint(torch.cuda.is_bf16_supported())\nprint(torch.ones(1, device='vnpu').is_cuda)\n"
    proc = _run(["-c", code], tmp_path)
    assert proc.stdout.split() == ["False", "False"]
    assert proc.stderr.count("CudaCallWarning") == 2, proc.stderr[-3000:]
    env = dict(os.environ, PYTHONWARNINGS="always", VNPU_SANITIZE="1")
    piped = subprocess.run([sys.executable, "-"], input=code, cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
    assert piped.returncode == 0 and piped.stdout.split() == ["False", "False"], piped.stderr[-3000:]


def test_without_the_sanitizer_and_under_port_mode_nothing_is_reported(tmp_path):
    proc = _run([NANOGPT, "--device=vnpu", f"--out={tmp_path / 'a.json'}"], tmp_path, sanitize=False)
    assert _reports(proc.stderr) == []
    # Port mode maps the CUDA calls to vnpu: they are not wrong there.
    proc = _run(["-m", "torch_vnpu.port.run", NANOGPT, f"--out={tmp_path / 'b.json'}"], tmp_path)
    assert _reports(proc.stderr) == []
    assert json.loads((tmp_path / "b.json").read_text())["fused"] is True


def test_calls_made_by_installed_packages_are_not_reported(tmp_path):
    # torchao, transformers... test torch.cuda themselves: not the user's code to change (the break test of
    # 2026-12-02 got four reports from torchao in a clean Hugging Face script).
    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "thirdparty.py").write_text(textwrap.dedent("""
        import torch
        AT_IMPORT = torch.cuda.is_available()
        def probe():
            return torch.cuda.is_bf16_supported(), torch.cuda.amp.GradScaler()
    """))
    (tmp_path / "user.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        import torch, thirdparty
        thirdparty.probe()
        torch.cuda.is_available()                # line 6: the user's own call is reported
    """))
    proc = _run(["user.py"], tmp_path)
    assert [(os.path.basename(p), n) for p, n, _ in _reports(proc.stderr)] == [("user.py", 6)]


def test_a_value_other_than_1_keeps_the_sanitizer_off_and_warns(tmp_path):
    # PyTorch's rule for boolean variables ("1" on, "0" off): "true" used to switch check 5 on while the runtime
    # kept the other checks off, so the user saw sanitizer output and believed it was on.
    (tmp_path / "p.py").write_text(textwrap.dedent("""
        import warnings
        warnings.simplefilter("always")
        import torch
        torch.cuda.is_available()
        with warnings.catch_warnings(record=True) as w:
            torch.ones(1, device="vnpu")
        print(torch.vnpu.sanitizer.is_enabled(), any("VNPU_SANITIZE" in str(x.message) for x in w))
    """))
    proc = _run(["p.py"], tmp_path, sanitize=False, extra_env={"VNPU_SANITIZE": "true"})
    assert _reports(proc.stderr) == []
    assert proc.stdout.split() == ["False", "True"], (proc.stdout, proc.stderr[-2000:])
