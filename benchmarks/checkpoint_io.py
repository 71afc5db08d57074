"""Loading a safetensors checkpoint onto vnpu and saving it from vnpu, against the same with CPU memory and against
reading the files.

A checkpoint of --size MiB in --shards files (float32/bfloat16 tensors of a transformer's shapes) is generated in
a temporary directory. Each way of loading runs in a fresh process (its peak RSS is its own), --repeats times,
median reported, warm page cache (the files were just written and read):

  read        every shard read into /dev/null with 16 MiB reads, all shards at once (dd): the storage limit
  cpu         safetensors.torch.load_file(device="cpu") and a copy of every tensor into process memory (what a
              load to host memory costs; safetensors alone only maps the file)
  vnpu        safetensors.torch.load_file(device="vnpu"): read straight into device memory (torch_vnpu.checkpoints)
  vnpu_staged the same through pinned staging buffers (VNPU_FILE_READS=0: what a device without file reads does)
  vnpu_copy   the per-tensor path it replaces: safetensors' own load (a CPU tensor of the mapped file, then a
              blocking copy per tensor)

the same tensors saved with torch.save (one .pt file per shard) and loaded with torch.load:

  pt_cpu          torch.load(map_location="cpu")
  pt_vnpu         torch.load(map_location="vnpu"): read into device memory (torch_vnpu.checkpoints.torch_load)
  pt_vnpu_copy    torch's own torch.load(map_location="vnpu"): a host copy and a blocking copy per storage

the same tensors saved with torch.distributed.checkpoint (one process, one .distcp file) and loaded into
pre-allocated tensors:

  dcp_cpu         dcp.load into CPU tensors
  dcp_vnpu        dcp.load into vnpu tensors: read into the device (torch_vnpu.checkpoints.dcp)
  dcp_vnpu_copy   DCP's own reader into vnpu tensors: each record built in host memory, then copied

the floor of any load into fresh vnpu memory:

  touch           allocating the checkpoint's bytes on vnpu and writing them once (first-touch page faults)

and saving the loaded checkpoint (each shard to a new file; the load is not timed):

  save_cpu        safetensors.torch.save_file of CPU tensors
  save_vnpu       safetensors.torch.save_file of vnpu tensors: written straight from device memory
                  (torch_vnpu.checkpoints)
  save_vnpu_staged the same through pinned staging buffers (VNPU_FILE_WRITES=0: what a device without file
                  writes does)
  save_vnpu_copy  the per-tensor path it replaces: safetensors' own save (a blocking copy of each tensor to CPU)
  pt_save_cpu         torch.save of CPU tensors
  pt_save_vnpu        torch.save of vnpu tensors: storages downloaded ahead into pinned buffers
                      (torch_vnpu.checkpoints.torch_save)
  pt_save_vnpu_copy   torch's own torch.save of vnpu tensors: a blocking copy per storage

Ratios: vnpu / cpu and read bandwidth fraction (read time / vnpu time). Host RSS of a vnpu load counts the device
memory too (the vNPU's memory is this process's): "host overhead" is peak RSS minus the checkpoint's bytes.
Every row runs twice: on a warm page cache (the files were just read) and a cold one (the checkpoint's pages are
evicted with posix_fadvise(DONTNEED) before each run; no root needed, and the libraries stay cached, so only the
checkpoint is read from storage). Each save writes new files after a sync, so no save waits for another's
write-back.

Writes OUT/checkpoint_io.json and prints a table.

    python benchmarks/checkpoint_io.py --out out/bench [--size 1024 --shards 4 --repeats 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _meta

_CHILD = r"""
import json, os, resource, sys, time
import torch, safetensors.torch as st
how, paths = sys.argv[1], sys.argv[2:]
if how == "touch":  # each shard's tensor bytes, from its header (the file's data is not read)
    import struct
    def data_bytes(p):
        with open(p, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        return sum(e - b for k, v in header.items() if k != "__metadata__" for b, e in [v["data_offsets"]])
    sizes = [data_bytes(p) for p in paths]
t0 = time.perf_counter()
if how == "cpu":
    out = [{k: v.clone() for k, v in st.load_file(p, device="cpu").items()} for p in paths]
elif how in ("vnpu", "vnpu_staged"):
    out = [st.load_file(p, device="vnpu") for p in paths]
    torch.vnpu.synchronize()
elif how == "vnpu_copy":
    load = getattr(st.load_file, "__wrapped__", st.load_file)  # safetensors' own load_file
    out = [load(p, device=0) for p in paths]  # device 0: the accelerator's device 0
    torch.vnpu.synchronize()
elif how == "touch":
    out = [{"x": torch.empty(n, dtype=torch.uint8, device="vnpu").fill_(1)} for n in sizes]
    torch.vnpu.synchronize()
elif how.startswith("dcp_"):
    import warnings
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as fs
    warnings.simplefilter("ignore")  # one process, no process group
    if how == "dcp_vnpu_copy":  # DCP's own reader (this child only)
        setattr(fs.FileSystemReader, "read_data", fs.FileSystemReader.read_data.__wrapped__)
    directory = os.path.join(os.path.dirname(paths[0]), "dcp")
    meta = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    device = "cpu" if how == "dcp_cpu" else "vnpu"
    state = {k: torch.empty(m.size, dtype=m.properties.dtype, device=device) for k, m in meta.items()}
    torch.vnpu.synchronize()
    t0 = time.perf_counter()
    dcp.load(state, checkpoint_id=directory)
    torch.vnpu.synchronize()
    out = [state]
elif how.startswith("pt_"):
    import torch.serialization
    load = torch.serialization.load if how == "pt_vnpu_copy" else torch.load  # torch's own, or the patched one
    out = [load(p[:-len(".safetensors")] + ".pt", map_location="cpu" if how == "pt_cpu" else "vnpu",
                weights_only=True) for p in paths]
    torch.vnpu.synchronize()
else:  # save_* / pt_save_*: load untimed, then save every shard to a new file
    out = [st.load_file(p, device="cpu" if how.endswith("save_cpu") else "vnpu") for p in paths]
    out = [{k: v.clone() for k, v in d.items()} for d in out]  # own memory, not the mapped file
    torch.vnpu.synchronize()
    if how.startswith("pt_"):
        save = torch.save
        if how == "pt_save_vnpu_copy":  # torch's own: a blocking copy per storage (this child only)
            import torch.storage
            setattr(torch.storage._StorageBase, "cpu", torch.storage._StorageBase.cpu.__wrapped__)
            save = torch.save.__wrapped__
    else:
        save = getattr(st.save_file, "__wrapped__", st.save_file) if how == "save_vnpu_copy" else st.save_file
    t0 = time.perf_counter()
    for p, d in zip(paths, out):
        save(d, f"{p}.{how}")
    torch.vnpu.synchronize()
seconds = time.perf_counter() - t0
nbytes = sum(v.numel() * v.element_size() for d in out for v in d.values())
print(json.dumps({"seconds": seconds, "bytes": nbytes,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _generate(directory, size_mib, shards):
    import torch
    import safetensors.torch as st

    g = torch.Generator().manual_seed(0)
    per_shard = size_mib * (1 << 20) // shards
    paths, everything = [], {}
    for s in range(shards):
        state, used, i = {}, 0, 0
        while used < per_shard:
            # a layer's worth: attention and MLP matrices in float32, norms and a bf16 projection
            for name, shape, dtype in (("q", (512, 512), torch.float32), ("mlp", (512, 1536), torch.float32),
                                       ("norm", (512,), torch.float32), ("proj", (1536, 512), torch.bfloat16)):
                t = torch.randn(shape, generator=g).to(dtype)
                state[f"layer{i}.{name}"] = t
                used += t.numel() * t.element_size()
            i += 1
        path = os.path.join(directory, f"model-{s:05d}-of-{shards:05d}.safetensors")
        st.save_file(state, path)
        torch.save(state, path[:-len(".safetensors")] + ".pt")
        paths.append(path)
        everything.update({f"shard{s}.{k}": v for k, v in state.items()})
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one process, no process group
        dcp.save(everything, checkpoint_id=os.path.join(directory, "dcp"))
    return paths


def _evict(paths):
    """Evict the files' pages from the page cache (they are clean); True if the kernel took the advice."""
    for q in paths:
        fd = os.open(q, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _read(paths):
    """Seconds to read the files with 16 MiB reads, all at once (one dd per file): the storage limit."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={q}", "of=/dev/null", "bs=16M"], stderr=subprocess.DEVNULL)
             for q in paths]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError(f"reading {paths} with dd failed")
    return time.perf_counter() - t0


def _child(how, paths):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if how == "vnpu_staged":
        env["VNPU_FILE_READS"] = "0"
    if how == "save_vnpu_staged":
        env["VNPU_FILE_WRITES"] = "0"
    proc = subprocess.run([sys.executable, "-c", _CHILD, how, *paths], capture_output=True, text=True,
                          timeout=1800, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{how}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench")
    p.add_argument("--size", type=int, default=1024, help="checkpoint size in MiB")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    run_meta = _meta.begin(__file__, argv)
    with tempfile.TemporaryDirectory() as d:
        paths = _generate(d, args.size, args.shards)
        other_paths = [q[:-len(".safetensors")] + ".pt" for q in paths]
        other_paths += [os.path.join(d, "dcp", f) for f in os.listdir(os.path.join(d, "dcp"))]
        total = sum(os.path.getsize(q) for q in paths)
        os.sync()
        results = {}
        for cache in ("warm", "cold"):
            rows = {"read": [], "cpu": [], "vnpu": [], "vnpu_staged": [], "vnpu_copy": [], "pt_cpu": [], "pt_vnpu": [],
                    "pt_vnpu_copy": [], "dcp_cpu": [], "dcp_vnpu": [], "dcp_vnpu_copy": [], "touch": [], "save_cpu": [], "save_vnpu": [],
                    "save_vnpu_staged": [], "save_vnpu_copy": [], "pt_save_cpu": [], "pt_save_vnpu": [],
                    "pt_save_vnpu_copy": []}
            rss = {"cpu": [], "vnpu": [], "vnpu_staged": [], "vnpu_copy": []}
            for _ in range(args.repeats):
                for how in rows:
                    if "save_" in how:
                        os.sync()  # no earlier write-back in flight
                    if cache == "cold":
                        _evict(paths + other_paths)
                    else:
                        _read(paths + other_paths)  # warm
                    if how == "read":
                        rows[how].append(_read(paths))
                    else:
                        r = _child(how, paths)
                        for q in paths:
                            if os.path.exists(f"{q}.{how}"):
                                os.remove(f"{q}.{how}")
                        rows[how].append(r["seconds"])
                        if how in rss:
                            rss[how].append(r["peak_rss"])
            med = {k: statistics.median(v) for k, v in rows.items()}
            results[cache] = {
                "seconds": med,
                "gib_per_s": {k: total / v / (1 << 30) for k, v in med.items()},
                "vnpu_over_cpu": med["vnpu"] / med["cpu"],
                "vnpu_copy_over_cpu": med["vnpu_copy"] / med["cpu"],
                "vnpu_staged_over_cpu": med["vnpu_staged"] / med["cpu"],
                "read_bandwidth_fraction": med["read"] / med["vnpu"],
                "pt_vnpu_over_cpu": med["pt_vnpu"] / med["pt_cpu"],
                "pt_vnpu_copy_over_cpu": med["pt_vnpu_copy"] / med["pt_cpu"],
                "dcp_vnpu_over_cpu": med["dcp_vnpu"] / med["dcp_cpu"],
                "dcp_vnpu_copy_over_cpu": med["dcp_vnpu_copy"] / med["dcp_cpu"],
                "touch_over_cpu": med["touch"] / med["cpu"],
                "save_vnpu_over_cpu": med["save_vnpu"] / med["save_cpu"],
                "save_vnpu_staged_over_cpu": med["save_vnpu_staged"] / med["save_cpu"],
                "save_vnpu_copy_over_cpu": med["save_vnpu_copy"] / med["save_cpu"],
                "pt_save_vnpu_over_cpu": med["pt_save_vnpu"] / med["pt_save_cpu"],
                "pt_save_vnpu_copy_over_cpu": med["pt_save_vnpu_copy"] / med["pt_save_cpu"],
                "min_seconds": {k: min(v) for k, v in rows.items()},
                "peak_rss_mib": {k: statistics.median(v) / (1 << 20) for k, v in rss.items()},
                "host_overhead_mib": {k: (statistics.median(v) - total) / (1 << 20) for k, v in rss.items()},
            }
    report = {"run": _meta.end(run_meta), "checkpoint_bytes": total, "shards": args.shards,
              "cold_page_cache": "posix_fadvise(POSIX_FADV_DONTNEED) of the checkpoint's files before each run",
              "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "checkpoint_io.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"checkpoint {total / (1 << 20):.0f} MiB in {args.shards} shards; load average "
          f"{report['run']['load_average_before']}")
    for cache, r in results.items():
        print(f"\n{cache} page cache")
        print(f"{'path':<10} {'s':>7} {'GiB/s':>7} {'peak RSS MiB':>13} {'host overhead MiB':>18}")
        for k in rows:
            rss_ = r["peak_rss_mib"].get(k)
            ovh = r["host_overhead_mib"].get(k)
            print(f"{k:<10} {r['seconds'][k]:7.3f} {r['gib_per_s'][k]:7.2f} "
                  f"{'' if rss_ is None else f'{rss_:13.0f}'} {'' if ovh is None else f'{ovh:18.0f}'}")
        print(f"vnpu / cpu = {r['vnpu_over_cpu']:.2f}x, per-tensor copy path / cpu = {r['vnpu_copy_over_cpu']:.2f}x, "
              f"read bandwidth reached = {100 * r['read_bandwidth_fraction']:.0f}%")
        print(f"torch.load: vnpu / cpu = {r['pt_vnpu_over_cpu']:.2f}x, per-storage copy path / cpu = "
              f"{r['pt_vnpu_copy_over_cpu']:.2f}x; first touch of the device memory / cpu load = "
              f"{r['touch_over_cpu']:.2f}x")
        print(f"dcp.load: vnpu / cpu = {r['dcp_vnpu_over_cpu']:.2f}x, DCP's own reader / cpu = "
              f"{r['dcp_vnpu_copy_over_cpu']:.2f}x")
        print(f"save: vnpu / cpu = {r['save_vnpu_over_cpu']:.2f}x, staged / cpu = "
              f"{r['save_vnpu_staged_over_cpu']:.2f}x, per-tensor copy path / cpu = {r['save_vnpu_copy_over_cpu']:.2f}x")
        print(f"torch.save: vnpu / cpu = {r['pt_save_vnpu_over_cpu']:.2f}x, per-storage copy path / cpu = "
              f"{r['pt_save_vnpu_copy_over_cpu']:.2f}x")


if __name__ == "__main__":
    main()
