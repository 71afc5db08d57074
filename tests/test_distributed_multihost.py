"""Two hosts simulated by two network namespaces (scripts/netns_setup.sh): torchrun --nnodes 2 with the c10d
rendezvous, one vnpu rank per host; vccl moves data over Gloo/TCP across the veth pair. DDP and FSDP2 train
the GPT of examples/train_gpt.py and must match its single-process loss curve. Skipped, with the reason,
where network namespaces cannot be created (needs root/CAP_NET_ADMIN and iproute2)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)
import train_gpt  # noqa: E402

from torch_vnpu.testing.distributed import free_port  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_snippets  # noqa: E402

STEPS = 3
PREFIX = f"vnpu-t{os.getpid() % 100000}"  # interface names stay within 15 characters


@pytest.fixture(scope="module")
def hosts():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 ('ip') is not installed: cannot create network namespaces")
    setup = subprocess.run(["sh", os.path.join(ROOT, "scripts", "netns_setup.sh"), PREFIX],
                           capture_output=True, text=True, timeout=60)
    if setup.returncode != 0:
        subprocess.run(["sh", os.path.join(ROOT, "scripts", "netns_teardown.sh"), PREFIX], timeout=60)
        pytest.skip(f"cannot create network namespaces here (needs root/CAP_NET_ADMIN): {setup.stderr.strip()}")
    try:
        yield [f"{PREFIX}0", f"{PREFIX}1"]
    finally:
        subprocess.run(["sh", os.path.join(ROOT, "scripts", "netns_teardown.sh"), PREFIX], timeout=60)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    # train_gpt seeds the global generators: restore them so later tests see the state they would without this one
    with torch.random.fork_rng(devices=list(range(torch.vnpu.device_count())), device_type="vnpu"):
        return train_gpt.main(["--device", "vnpu", "--steps", str(STEPS), "--eval-interval", "0", "--out", str(out),
                               "--quiet"])


def test_two_hosts_command_from_the_docs(hosts, reference, tmp_path):
    """docs/distributed.md's two-host command, run as written (bash, from the repository root): DDP over two
    namespaces trains like one process."""
    result_file = os.path.join(ROOT, "out", "two-hosts", "losses.json")
    if os.path.exists(result_file):
        os.remove(result_file)
    script = tmp_path / "two_hosts.sh"
    script.write_text(docs_snippets.block("distributed.md", "test_two_hosts_command_from_the_docs"))
    # .venv/bin/torchrun as written: this interpreter's environment wherever the tests run from
    venv = os.path.dirname(os.path.dirname(sys.executable))
    if os.path.realpath(venv) != os.path.realpath(os.path.join(ROOT, ".venv")):
        pytest.skip(f"the docs' command uses .venv/bin/torchrun; these tests run from {venv}")
    proc = subprocess.run(["bash", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and os.path.exists(result_file), proc.stdout[-2000:] + proc.stderr[-4000:]
    with open(result_file) as f:
        result = json.load(f)
    assert result["world_size"] == 2 and result["transport"] == "gloo"  # across hosts: Gloo over TCP
    for a, b in zip(reference["train"], result["train"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (reference["train"], result["train"])


@pytest.mark.parametrize("mode", [pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_hosts_train_like_one_process(mode, hosts, reference, tmp_path):
    port = free_port()
    procs = []
    for node, ns in enumerate(hosts):
        cmd = ["ip", "netns", "exec", ns, "env", f"GLOO_SOCKET_IFNAME={ns}-v", sys.executable, "-m",
               "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"10.231.0.1:{port}",
               "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}", "--local-addr", f"10.231.0.{node + 1}",
               os.path.join(EXAMPLES, "train_gpt_dist.py"), "--parallel", mode, "--steps", str(STEPS),
               "--out", str(tmp_path), "--quiet"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outputs.append((p.returncode, out, err))
    for rc, out, err in outputs:
        assert rc == 0, out[-2000:] + err[-4000:]
    result = json.loads((tmp_path / "losses.json").read_text())
    assert result["world_size"] == 2 and result["transport"] == "gloo"  # across hosts: Gloo over TCP
    for a, b in zip(reference["train"], result["train"]):
        assert abs(a - b) <= 1e-5 * abs(a), (reference["train"], result["train"])
    ckpt = torch.load(tmp_path / "ckpt.pt", map_location="cpu")
    assert all(t.device.type == "cpu" for t in ckpt["model"].values())
