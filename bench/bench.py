"""Throughput benchmark: plain SGLang prefill vs hsdump vs SGLang's built-in hidden-state path.

In one process, on one machine, with the same engine settings, model and samples, and one
engine at a time (each shut down before the next starts):

  a   plain prefill: `sglang.srt.entrypoints.engine.Engine`, no capture, `generate(...,
      max_new_tokens=1, return_hidden_states=False)` over all samples in one call;
  b0  hsdump capture only: `CaptureEngine.run` with a sink that drops the rows (same engine as b);
  b   hsdump end to end: `CaptureEngine` + `DatasetWriter` writing the dataset to local disk
      (timed until `writer.close()` has fsynced the last shard);
  b8  as b with `output.dtype=fp8` (`DatasetWriter(dtype="fp8")`: e4m3 rows plus a float32
      scale per token), on b's engine right after b (`--modes a,b,b8`; `--fp8-tokens` runs it
      on the first samples only);
  c   SGLang's built-in path: an Engine with aux capture on (0.5.17: EAGLE-3 layers set by a
      scheduler hook; 0.5.23: capture-only EAGLE3 mode) and `return_hidden_states=True`, the
      caller collecting the Python lists.

It also measures the output disk's sequential write bandwidth (dd with oflag=direct and with
conv=fdatasync) and the serial stages of the writer thread (safetensors serialize, sha256,
write+fsync) on one shard's worth of data. Peak host memory is the summed RSS of this process
and all its descendants (SGLang's scheduler and detokenizer), peak GPU memory is NVML's
device-wide `used` (summed over the engine's `--tp` GPUs); both are sampled every 0.2 s during
the timed window.

    make bench                                       # CPU-sized: tiny Llama, SGLang CPU engine
    python3 bench/bench.py --device cuda --models llama8b:2048:128:8 --name gpu-llama8b
    python3 bench/bench.py --device cuda --models llama8b:2048/8192 --deadline-s 560
    python3 bench/bench.py --device cuda --models kimi-width:2048 --modes a,b,b8,c --weights dummy
    python3 bench/bench.py --device cuda --tp 2 --models llama8b:2048:512:2 --modes a,b \
        --weights dummy                              # TP 2 on two GPUs (bench/README.md)
    python3 bench/writer_bench.py --dir /output/disk               # DatasetWriter alone

On the GPU machine, first `source .gpu/part1/install.sh` and put the repo on PYTHONPATH
(see bench/README.md). Sequence lengths of one model share its three engines.

Models: `tiny-llama` (CPU), `llama8b` (Llama-3.1-8B dimensions), `dsv3-small` (DeepSeek-V3
architecture, real MLA dims, hidden 512, 8 layers), `kimi-width` (DeepSeek-V3 architecture at
Kimi-K2.5's widths: hidden 7168, its MLA dims, 64 heads, expert width 2048, dense width 18432,
vocab 163840, yarn rope; 8 layers, the first dense, and 16 routed experts with top-8 plus the
shared one, so its 8.8 B parameters fit one GPU). `--weights files` (default) saves random
weights with save_pretrained; `--weights dummy` writes config.json alone and has SGLang fill
the weights at load (`load_format="dummy"`), which needs no disk and no build time.

Results: a table on stdout and bench/results/<name>.json (--results-dir to change).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional

import torch

from hsdump.testing import models, speed

HERE = Path(__file__).resolve().parent

AUX_ENV = "HSDUMP_BENCH_AUX_LAYERS"
WRITER_OPTS: Dict[str, int] = {}  # DatasetWriter's threads / shard_bytes (--writer-threads, ...)

# built by build_model(); capture layers from default_layers(); sizes chosen in main()
MODELS = ("tiny-llama", "llama-small", "llama8b", "dsv3-small", "kimi-width")
WEIGHTS = ("files", "dummy")


# --------------------------------------------------------------------------- models
def build_model(name: str, dest: str, weights: str = "files") -> str:
    """hsdump.testing.models' checkpoint of `name` (dsv3-small at 8 layers), reused if dest
    already holds one: random bf16 weights, built on the GPU where there is one; or, weights
    "dummy", config.json only (SGLang's load_format=dummy fills the weights)."""
    from hsdump.testing import models

    if name == "tiny-llama":
        from hsdump.tiny import resolve_model_path

        return resolve_model_path("tiny:llama")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; use one of {MODELS}")
    kw = models.BENCH_KW.get(name, {})
    if weights == "dummy":
        return models.build(name, dest + "-dummy", weights="dummy", **kw)
    if (Path(dest) / "config.json").exists():
        return dest
    # built in a child process, so this process never holds GPU memory
    code = (
        "import sys, torch; from hsdump.testing import models; "
        "models.build(sys.argv[2], sys.argv[1], device='cuda' if torch.cuda.is_available() "
        "else 'cpu', **models.BENCH_KW.get(sys.argv[2], {}))"
    )
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", code, dest, name], check=True)
    return dest


def default_layers(name: str, num_layers: int) -> List[int]:
    if name in ("dsv3-small", "kimi-width"):  # the Kimi-K2.5 preset's [3, 31, 59] of 61 is
        # [3, L // 2 + 1, L - 2]; at L = 8: [3, 5, 6]
        return [3, num_layers // 2 + 1, num_layers - 2]
    from hsdump.capture.layers import eagle3_default

    return eagle3_default(num_layers)


# --------------------------------------------------------------------------- monitoring
class _NvmlMem(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Gpu:
    """Device-wide memory use through NVML (no CUDA context in this process), summed over the
    first `count` visible GPUs (the engine's TP ranks)."""

    def __init__(self, count: int = 1):
        self.handles: List[ctypes.c_void_p] = []
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0:
                return
            vis = [
                x.strip()
                for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                if x.strip()
            ][:count]
            ok = len(vis) == count and all(x.isdigit() for x in vis)
            idxs = [int(x) for x in vis] if ok else list(range(count))
            for idx in idxs:
                h = ctypes.c_void_p()
                if self.lib.nvmlDeviceGetHandleByIndex_v2(idx, ctypes.byref(h)) != 0:
                    self.handles = []
                    return
                self.handles.append(h)
        except OSError:
            pass

    def used(self) -> Optional[int]:
        if not self.handles:
            return None
        total = 0
        for h in self.handles:
            m = _NvmlMem()
            if self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) != 0:
                return None
            total += int(m.used)
        return total


def _tree_pids(root: int) -> List[int]:
    """`root` and all its descendants, from /proc."""
    parent: Dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
                parent[int(d)] = int(st[st.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    keep, changed = {root}, True
    while changed:
        changed = False
        for pid, pp in parent.items():
            if pp in keep and pid not in keep:
                keep.add(pid)
                changed = True
    return sorted(keep)


def tree_rss(root: int) -> int:
    """Summed VmRSS (bytes) of `root` and all its descendants."""
    total = 0
    for pid in _tree_pids(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(root: int) -> Dict[tuple, float]:
    """CPU seconds (user + system) of every process (tid None) and every live thread of
    `root` and its descendants, keyed by (pid, process name, tid, thread name). The root's Python threads are named by their
    `threading` names (the writer threads, the receiver), the others by their OS names."""
    py_names = {t.native_id: t.name for t in threading.enumerate()}
    out: Dict[tuple, float] = {}
    for pid in _tree_pids(root):
        try:
            with open(f"/proc/{pid}/comm") as f:
                pname = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        # the process's own total also counts its threads that have exited (a DatasetWriter's
        # threads end with it, inside the window); tid None marks it
        fields = st[st.rindex(")") + 2 :].split()
        out[(pid, pname, None, "")] = (int(fields[11]) + int(fields[12])) / _TICK
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1 : st.rindex(")")]
            fields = st[st.rindex(")") + 2 :].split()
            if pid == root:
                name = py_names.get(int(tid), name)
            out[(pid, pname, int(tid), name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def host_cpu() -> List[int]:
    """/proc/stat's aggregate line: user nice system idle iowait irq softirq steal (ticks)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def cpu_window(t0: dict, t1: dict, h0: List[int], h1: List[int], wall: float) -> dict:
    """Where the host's CPU went between two snapshots: the whole host's busy, iowait and
    steal shares of its cores, each process of the tree in cores (CPU s / wall s), and the
    busiest threads."""
    d = [b - a for a, b in zip(h0, h1)]
    total = sum(d) or 1
    procs: Dict[str, float] = {}
    threads = []
    for key, v in t1.items():
        used = v - t0.get(key, 0.0)
        if used <= 0:
            continue
        pid, pname, tid, name = key
        if tid is None:
            procs[f"{pname}[{pid}]"] = used
        else:
            threads.append((used, f"{pname}[{pid}]/{name}[{tid}]"))
    threads.sort(reverse=True)
    wall = max(wall, 1e-9)
    cmdlines = {}
    for name in procs:  # what each process is (a busy child with a bare name, e.g. a JIT build)
        pid = name[name.rindex("[") + 1 : -1]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdlines[name] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            cmdlines[name] = "(exited)"
    return {
        "cpus": os.cpu_count(),
        "wall_s": wall,
        "host_busy_cores": (d[0] + d[1] + d[2] + d[5] + d[6]) / total * os.cpu_count(),
        "host_iowait_cores": d[4] / total * os.cpu_count(),
        "host_steal_cores": d[7] / total * os.cpu_count(),
        "tree_cores": {
            k: round(v / wall, 3) for k, v in sorted(procs.items(), key=lambda kv: -kv[1])
        },
        "top_threads_cores": {n: round(u / wall, 3) for u, n in threads[:16]},
        "cmdlines": cmdlines,
    }


class Monitor(threading.Thread):
    def __init__(self, period: float = 0.2, gpus: int = 1):
        super().__init__(name="bench-monitor", daemon=True)
        self.period = period
        self.gpu = Gpu(gpus)
        self.lock = threading.Lock()
        self.peak_rss = 0
        self.peak_gpu: Optional[int] = None
        self._halt = threading.Event()

    def sample(self):
        r = tree_rss(os.getpid())
        g = self.gpu.used()
        with self.lock:
            self.peak_rss = max(self.peak_rss, r)
            if g is not None:
                self.peak_gpu = g if self.peak_gpu is None else max(self.peak_gpu, g)
        return r, g

    def run(self):
        while not self._halt.wait(self.period):
            try:
                self.sample()
            except Exception:  # never kill the benchmark over a sampling hiccup
                pass

    def reset(self) -> dict:
        """Start a window; returns the current (baseline) values."""
        with self.lock:
            self.peak_rss, self.peak_gpu = 0, None
        r, g = self.sample()
        try:
            self._cpu0 = (time.time(), thread_cpu(os.getpid()), host_cpu())
        except Exception:  # CPU accounting is a diagnostic; never fail the run over it
            self._cpu0 = None
        return {"rss_bytes": r, "gpu_used_bytes": g}

    def peaks(self) -> dict:
        self.sample()
        cpu = None
        if getattr(self, "_cpu0", None):
            try:
                t, th, h = self._cpu0
                cpu = cpu_window(th, thread_cpu(os.getpid()), h, host_cpu(), time.time() - t)
            except Exception:
                cpu = None
        with self.lock:
            return {
                "peak_rss_bytes": self.peak_rss,
                "peak_gpu_used_bytes": self.peak_gpu,
                "cpu": cpu,
            }

    def stop(self):
        self._halt.set()


# --------------------------------------------------------------------------- disk & writer stages
def disk_bandwidth(out_dir: str, mib: int) -> dict:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = os.path.join(out_dir, ".dd-test")
    res = {"path": out_dir, "bytes": mib << 20}
    for label, flag in (("oflag_direct", "oflag=direct"), ("conv_fdatasync", "conv=fdatasync")):
        t = time.time()
        p = subprocess.run(
            ["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={mib // 16}", flag],
            capture_output=True,
            text=True,
        )
        dt = time.time() - t
        if p.returncode == 0:
            res[label + "_bytes_per_s"] = (mib << 20) / dt
            res[label + "_dd_says"] = p.stderr.strip().splitlines()[-1]
        else:
            res[label + "_error"] = p.stderr.strip()[-300:]
        try:
            os.unlink(path)
        except OSError:
            pass
    return res


def writer_stages(out_dir: str, nbytes: int, width: int) -> dict:
    """Rates of the writer thread's serial steps on one shard of `nbytes` (bf16 rows)."""
    from safetensors.torch import save

    rows = max(1, nbytes // (2 * width) // 8)
    tensors = {
        f"{i}/hidden_states/0": torch.randn(rows, width).to(torch.bfloat16) for i in range(8)
    }
    total = sum(t.numel() * 2 for t in tensors.values())
    t0 = time.time()
    data = save(tensors, metadata={"format": "bench"})
    t1 = time.time()
    hashlib.sha256(data).hexdigest()
    t2 = time.time()
    path = os.path.join(out_dir, ".stage-test")
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    t3 = time.time()
    os.unlink(path)
    return {
        "bytes": total,
        "serialize_bytes_per_s": total / (t1 - t0),
        "sha256_bytes_per_s": total / (t2 - t1),
        "write_fsync_bytes_per_s": total / (t3 - t2),
        "serial_bytes_per_s": total / (t3 - t0),
    }


# --------------------------------------------------------------------------- engines
def _prepare(device: str) -> None:
    """SGLang's CPU engine switch and libcuda stub, as in every scheduler process."""
    from hsdump.capture.patch import prepare_process

    prepare_process(device)


def engine_config(device: str, mem_fraction: Optional[float]):
    """conf/engine/cpu.yaml or conf/engine/gpu.yaml (mem_fraction_static overridable; as in
    gpu.yaml no prefill CUDA graphs, and plain_kwargs and hsdump's engine skip the decode graphs
    of a run that never decodes)."""
    from hsdump.capture.start import engine_preset

    over = {"mem_fraction_static": mem_fraction} if mem_fraction else {}
    return engine_preset("cpu" if device == "cpu" else "gpu", **over)


def plain_kwargs(model_path: str, ec, tp: int = 1) -> dict:
    """The keyword arguments hsdump's engine gives sglang, minus everything about capture."""
    from hsdump.capture.serving import plain_kwargs as engine_settings
    from hsdump.capture.serving import start_kwargs
    from hsdump.config import ModelConfig

    kw = engine_settings(ec, model_path, ModelConfig(path=model_path, tp_size=tp))
    kw.update(start_kwargs(ec, False))  # the CUDA graphs of a run that never decodes
    kw.update(ec.extra)  # e.g. load_format="dummy" (--weights dummy), as hsdump's engine does
    return kw


def aux_scheduler_process(*args, **kwargs):
    """Scheduler entry for mode c on SGLang 0.5.17 (device README §4), plus the same
    layers_to_capture override hsdump makes, so both capture the same HF indices."""
    layers = sorted(int(x) for x in os.environ[AUX_ENV].split(","))
    from sglang.srt.model_executor import model_runner as mr

    orig = mr.ModelRunner.load_model

    def load_model(self, *a, **k):
        out = orig(self, *a, **k)
        if not getattr(self, "is_draft_worker", False):
            self.model.set_eagle3_layers_to_capture([k - 1 for k in layers])
            self.model.model.layers_to_capture = list(layers)
        return out

    mr.ModelRunner.load_model = load_model
    from sglang.srt.managers.scheduler import run_scheduler_process

    return run_scheduler_process(*args, **kwargs)


def builtin_engine(model_path: str, ec, layers: List[int], version: str, tp: int = 1):
    from sglang.srt.entrypoints.engine import Engine

    kw = plain_kwargs(model_path, ec, tp)
    kw["enable_return_hidden_states"] = True
    if version == "0.5.17":
        os.environ[AUX_ENV] = ",".join(str(k) for k in layers)

        class AuxEngine(Engine):
            run_scheduler_process_func = staticmethod(aux_scheduler_process)

        return AuxEngine(**kw)
    kw.update(
        speculative_algorithm="EAGLE3",
        enable_return_aux_hidden_states=True,
        return_aux_hidden_state_layer_ids=[k - 1 for k in sorted(layers)],
    )
    return Engine(**kw)


SP = {"max_new_tokens": 1, "temperature": 0.0}


def _rate(tokens: int, samples: int, walls: List[float], **extra) -> dict:
    """Rates from the median wall time of the repeats (all walls are kept)."""
    wall = statistics.median(walls)
    d = {
        "wall_s": wall,
        "walls_s": walls,
        "tokens": tokens,
        "samples": samples,
        "tokens_per_s": tokens / wall,
        "samples_per_s": samples / wall,
    }
    d.update(extra)
    return d


def sharegpt_lengths() -> List[int]:
    """ShareGPT V3's token lengths under the Llama-3.1 template (bench/sharegpt_lengths.py)."""
    return json.loads((HERE / "sharegpt_v3_lengths.json").read_text())["lengths"]


def _count_within(lens: List[int], budget: int) -> int:
    """How many of the first lengths fit in `budget` tokens (at least one)."""
    total = 0
    for i, m in enumerate(lens):
        total += m
        if total > budget:
            return max(1, i)
    return len(lens)


class Workload:
    """One sequence length: the timed samples, the warm-up samples, the built-in subset."""

    def __init__(self, seq: int, samples, warm, n_builtin: int):
        self.seq, self.samples, self.warm, self.n_builtin = seq, samples, warm, n_builtin
        self.tokens = sum(len(s) for s in samples)


def mode_plain(model_path, ec, loads: List[Workload], mon, repeat: int = 1, tp: int = 1) -> dict:
    """Mode a. Returns {seq: result} plus "_engine" facts."""
    from sglang.srt.entrypoints.engine import Engine

    out = {"_engine": {"baseline": mon.reset()}}
    t0 = time.time()
    eng = Engine(**plain_kwargs(model_path, ec, tp))
    out["_engine"]["engine_start_s"] = time.time() - t0
    try:
        for w in loads:
            t = time.time()
            eng.generate(input_ids=w.warm, sampling_params=SP, return_hidden_states=False)
            warm_s = time.time() - t
            idle = mon.reset()
            walls = []
            for _ in range(repeat):
                t = time.time()
                outs = eng.generate(
                    input_ids=w.samples, sampling_params=SP, return_hidden_states=False
                )
                walls.append(time.time() - t)
                assert len(outs) == len(w.samples)
            out[w.seq] = _rate(
                w.tokens, len(w.samples), walls, warmup_s=warm_s, idle=idle, **mon.peaks()
            )
    finally:
        eng.shutdown()
    return out


def mode_hsdump(
    model_path,
    ec,
    loads: List[Workload],
    layers,
    info,
    out_dir,
    mon,
    repeat: int = 1,
    storages=("bfloat16",),
    fp8_tokens: int = 0,
    on_partial=None,
    tp: int = 1,
    final=(),
) -> dict:
    """Modes b0 (capture, rows dropped), b (capture + DatasetWriter to disk) and b8 (the same
    with storage fp8, if "fp8" is in `storages`), one engine. b8 runs on the first samples
    holding `fp8_tokens` tokens (0: all of b's). `on_partial(seq, results)` is called after
    each of them, so that a run cut short keeps what it measured."""
    from hsdump.capture.base import Request
    from hsdump.capture.start import rows_manifest, start
    from hsdump.store.writer import DatasetWriter

    out = {"_engine": {"baseline": mon.reset()}}
    t0 = time.time()
    eng = start(model_path, layers, ec, tp_size=tp, info=info, final=final)
    out["_engine"].update(engine_start_s=time.time() - t0, sglang=eng.version)
    k_bytes = (len(layers) + len(final)) * info.hidden_size * 2
    ds_dir = os.path.join(out_dir, "dataset")
    sid_base = [0]

    def sids(items):  # request ids must not repeat within one engine
        sid_base[0] += 1_000_000
        return [Request(sid_base[0] + i, s, [1] * len(s)) for i, s in enumerate(items)]

    def to_disk(samples: List[List[int]], storage: str) -> dict:
        """Capture + DatasetWriter(dtype=storage), timed until close() has committed all."""
        tokens = sum(len(x) for x in samples)
        manifest = rows_manifest(model_path, layers, info, storage_dtype=storage, final=final)
        idle = mon.reset()
        walls, details = [], []
        for _ in range(repeat):
            shutil.rmtree(ds_dir, ignore_errors=True)
            t = time.time()
            writer = DatasetWriter(ds_dir, manifest, **WRITER_OPTS)

            try:
                eng.run(sids(samples), writer.add_sample)
                t_run = time.time() - t
            finally:
                t_c = time.time()
                writer.close()
                close_s = time.time() - t_c
            walls.append(time.time() - t)
            assert writer.samples_written == len(samples)
            details.append(
                {
                    "run_s": t_run,
                    "sink_add_s": writer.timing["add_s"],
                    "final_close_s": close_s,
                    "bytes_written": writer.bytes_written,
                    "writer_timing": dict(writer.timing),
                    "shards": writer.shards_written,
                }
            )
            shutil.rmtree(ds_dir, ignore_errors=True)
        wall = statistics.median(walls)
        n_bytes = details[0]["bytes_written"]
        # run phase: until the engine has handed the last sample to the writer; the rest
        # of the wall is the final flush (the last shards written and fsynced), a fixed
        # cost per run that a long extraction amortizes
        run_rate = tokens / statistics.median([d["run_s"] for d in details])
        return _rate(
            tokens,
            len(samples),
            walls,
            storage_dtype=storage,
            bytes_written=n_bytes,
            bytes_per_token=n_bytes / tokens,
            run_tokens_per_s=run_rate,
            bytes_written_per_s=n_bytes / wall,
            payload_bytes_per_s=tokens * k_bytes / wall,
            repeats=details,
            idle=idle,
            **mon.peaks(),
        )

    try:
        for w in loads:
            res = {}
            t = time.time()
            eng.run(sids(w.warm), lambda s: None)
            res["warmup_s"] = time.time() - t

            got = [0, 0]

            def null_sink(s):
                got[0] += 1
                got[1] += s.layers[0].shape[0]

            idle = mon.reset()
            walls = []
            for _ in range(repeat):
                got[:] = [0, 0]
                t = time.time()
                eng.run(sids(w.samples), null_sink)
                walls.append(time.time() - t)
                assert got == [len(w.samples), w.tokens], got
            res["b0"] = _rate(
                w.tokens,
                len(w.samples),
                walls,
                payload_bytes_per_s=w.tokens * k_bytes / statistics.median(walls),
                idle=idle,
                **mon.peaks(),
            )
            if on_partial:
                on_partial(w.seq, res)
            for storage in storages:
                key = "b8" if storage == "fp8" else "b"
                samples = w.samples
                if storage == "fp8" and fp8_tokens:
                    samples = w.samples[: _count_within([len(x) for x in w.samples], fp8_tokens)]
                try:
                    res[key] = to_disk(samples, storage)
                except Exception as e:  # b8 failing must not lose b
                    res[key] = {
                        "error": f"{type(e).__name__}: {e}",
                        "traceback": traceback.format_exc()[-3000:],
                    }
                    print(traceback.format_exc())
                    if key == "b":
                        raise
                if on_partial:
                    on_partial(w.seq, res)
            out[w.seq] = res
    finally:
        eng.close()
        shutil.rmtree(ds_dir, ignore_errors=True)
    return out


def fp8_host_cost(hidden: int, slots: int, seq: int = 2048, reps: int = 3) -> dict:
    """Time of the writer's fp8 encoding (hsdump.store.fp8.quantize, on the CPU, in writer.add on
    the caller's thread) for one sample of `slots` [seq, hidden] bf16 tensors."""
    from hsdump.store import fp8

    xs = [torch.randn(seq, hidden).to(torch.bfloat16) for _ in range(slots)]
    for x in xs:
        fp8.quantize(x)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for x in xs:
            fp8.quantize(x)
        times.append(time.perf_counter() - t)
    ms = statistics.median(times) * 1e3
    return {
        "seq": seq,
        "hidden": hidden,
        "slots": slots,
        "torch_threads": torch.get_num_threads(),
        "ms_per_sample": ms,
        "tokens_per_s_ceiling": seq / (ms / 1e3),
    }


def mode_builtin(
    model_path, ec, loads: List[Workload], layers, info, version, mon, repeat: int = 1, tp: int = 1
) -> dict:
    """Mode c: SGLang's own return path, the caller keeping every returned list."""
    out = {"_engine": {"baseline": mon.reset()}}
    t0 = time.time()
    eng = builtin_engine(model_path, ec, layers, version, tp)
    out["_engine"]["engine_start_s"] = time.time() - t0
    width = len(layers) * info.hidden_size
    try:
        for w in loads:
            if w.n_builtin < 1:
                continue  # not measured at this length (--models MODEL:SEQ:N:0)
            samples = w.samples[: w.n_builtin]
            n_tok = sum(len(s) for s in samples)
            t = time.time()
            eng.generate(input_ids=w.warm[:1], sampling_params=SP, return_hidden_states=True)
            warm_s = time.time() - t
            idle = mon.reset()
            walls = []
            for _ in range(repeat):
                t = time.time()
                outs = eng.generate(
                    input_ids=samples, sampling_params=SP, return_hidden_states=True
                )
                collected = [o["meta_info"]["hidden_states"][0] for o in outs]
                walls.append(time.time() - t)
                for s, hs in zip(samples, collected):
                    assert len(hs) == len(s) and len(hs[0]) == width, (len(hs), len(hs[0]), width)
                del outs, collected
            out[w.seq] = _rate(
                n_tok,
                len(samples),
                walls,
                payload_bytes_per_s=n_tok * width * 2 / statistics.median(walls),
                warmup_s=warm_s,
                idle=idle,
                **mon.peaks(),
            )
    finally:
        eng.shutdown()
    return out


# --------------------------------------------------------------------------- report
def _gb(x):
    return "-" if x is None else f"{x / 1e9:.2f}"


def _mb(x):
    return "-" if x is None else f"{x / 1e6:,.1f}"


def table(name: str, r: dict, tp: int = 1) -> str:
    b = r.get("b") or {}
    rows = [
        ("a plain prefill", r.get("a")),
        ("b0 hsdump capture only", b.get("b0")),
        ("b hsdump -> disk", b.get("b")),
        ("c built-in lists", r.get("c")),
    ]
    if b.get("b8"):
        rows.insert(3, ("b8 hsdump -> disk, fp8", b.get("b8")))
    lines = [
        f"{name}: {r['model']} seq {r['seq']} tp {r.get('tp', tp)} layers {r['layers']} "
        f"(samples a/b {r['samples']}, c {r['samples_builtin']})",
        "| mode | tokens/s | samples/s | write MB/s | payload MB/s | peak RSS GB "
        "| peak GPU GB | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, m in rows:
        if not m or "tokens_per_s" not in m:
            err = (m or {}).get("error", "not run") if isinstance(m, dict) else "not run"
            lines.append(f"| {label} | {str(err)[:60]} | | | | | | |")
            continue
        lines.append(
            f"| {label} | {m['tokens_per_s']:,.0f} | {m['samples_per_s']:.2f} | "
            f"{_mb(m.get('bytes_written_per_s'))} | {_mb(m.get('payload_bytes_per_s'))} | "
            f"{_gb(m.get('peak_rss_bytes'))} | {_gb(m.get('peak_gpu_used_bytes'))} | "
            f"{m['wall_s']:.1f} |"
        )
    ra = r.get("ratios", {})
    lines.append("ratios: " + ", ".join(f"{k} = {v:.3f}" for k, v in ra.items()))
    for key in ("b", "b8"):
        m = b.get(key) or {}
        if "bytes_per_token" in m:
            lines.append(
                f"{key}: {m['bytes_per_token']:,.0f} bytes per token, "
                f"{m['tokens']:,} tokens, run {m['run_tokens_per_s']:,.0f} tokens/s"
            )
    for key, d in [(k, d) for k in ("b", "b8") for d in (b.get(k) or {}).get("repeats", [])]:
        wt = d.get("writer_timing", {})
        lines.append(
            f"{key} profile: run {d['run_s']:.1f} s, "
            f"in writer.add {d['sink_add_s']:.1f} s "
            f"(blocked on the shard queue {wt.get('queue_wait_s', 0):.1f} s), "
            f"final close {d['final_close_s']:.1f} s, shard commits "
            f"{wt.get('commit_s', 0):.1f} thread-s over {d['shards']} shards"
        )
    for label, m in rows:
        cpu = (m or {}).get("cpu") if isinstance(m, dict) else None
        if cpu:
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(cpu["tree_cores"].items())[:4])
            lines.append(
                f"{label.split()[0]} cpu: host busy {cpu['host_busy_cores']:.1f} of "
                f"{cpu['cpus']} cores (iowait {cpu['host_iowait_cores']:.1f}, steal "
                f"{cpu['host_steal_cores']:.1f}); cores by process: {top}"
            )
    return "\n".join(lines)


def environment(device: str) -> dict:
    from importlib import metadata

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "cpus": os.cpu_count(),
        "mem_total_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
    }
    for pkg in ("sglang", "sglang-kernel", "torch", "transformers", "safetensors", "pyzmq"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = None
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    env["host"] = speed.host_identity()  # host, boot and HSDUMP_SPEED_SESSION
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu_model"] = re.search(r"model name\s*:\s*(.*)", f.read()).group(1)
    except Exception:
        pass
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="hsdump throughput benchmark (see module doc)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--models",
        default=None,
        help="comma list of MODEL:SEQ[/SEQ...][:N[:N_BUILTIN]]; MODEL in "
        + ", ".join(MODELS)
        + "; the sequence lengths of one model share its engines",
    )
    ap.add_argument("--modes", default="a,b,c")
    ap.add_argument("--name", default=None, help="results file name (default: the device)")
    ap.add_argument("--results-dir", default=str(HERE / "results"))
    ap.add_argument("--out-dir", default="/tmp/hsdump-bench", help="dataset and dd target")
    ap.add_argument("--model-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument(
        "--tp",
        type=int,
        default=1,
        help="SGLang tensor-parallel size of every mode's engine (a, b0, b, b8, c)",
    )
    ap.add_argument("--mem-fraction", type=float, default=None)
    ap.add_argument("--dd-mib", type=int, default=None)
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed runs per mode, median reported (default: 2 on CPU, 1 on GPU)",
    )
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=0,
        help="skip modes that would start after this many seconds",
    )
    ap.add_argument(
        "--deadline-modes",
        default=None,
        help="comma list: the modes the deadline may skip (default: all)",
    )
    ap.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="tokens per timed run and length (default 2M small models, 0.5M 8B)",
    )
    ap.add_argument("--writer-threads", type=int, default=None)
    ap.add_argument("--shard-mib", type=int, default=None)
    ap.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="files",
        help="files: random weights saved with save_pretrained; dummy: config.json "
        "only, SGLang fills random weights at load (load_format=dummy)",
    )
    ap.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="disable_cuda_graph=True in every mode: skips capturing decode graphs "
        "that max_new_tokens=1 never replays (MLA models run no prefill graph)",
    )
    ap.add_argument(
        "--fp8-tokens",
        type=int,
        default=0,
        help="mode b8 on the first samples holding this many tokens (0: all of b's)",
    )
    ap.add_argument(
        "--writer-stages-mib",
        type=int,
        default=None,
        help="MiB of the serial writer-stage probe (default 1024 GPU, 64 CPU; 0 skips)",
    )
    ap.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the engine's context_length (SGLang's): above the model's "
        "max_position_embeddings (131,072 for llama8b) for samples of 128K tokens and more; "
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is set for it",
    )
    ap.add_argument(
        "--final",
        default="",
        help="comma list of final states mode b captures beside the layers (pre_norm, "
        "post_norm): a capture with EAGLE-3's training target, as SpecForge's records hold it",
    )
    args = ap.parse_args(argv)
    final = tuple(x for x in args.final.split(",") if x)
    bad = [x for x in final if x not in ("pre_norm", "post_norm")]
    if bad:
        ap.error(f"--final {args.final}: {bad} is not a final state (pre_norm, post_norm)")
    if args.tp < 1:
        ap.error(f"--tp {args.tp}: must be >= 1")
    tp = args.tp
    if args.writer_threads:
        WRITER_OPTS["threads"] = args.writer_threads
    if args.shard_mib:
        WRITER_OPTS["shard_bytes"] = args.shard_mib << 20
    dev = args.device
    gpu = dev == "cuda"
    if args.models is None:
        args.models = "llama8b:2048,dsv3-small:2048" if gpu else "tiny-llama:256:32:16"
    name = args.name or ("gpu" if gpu else "cpu")
    repeat = args.repeat or (1 if gpu else 2)
    t_start = time.time()
    _prepare(dev)
    from hsdump.capture.layers import read_model_info
    from hsdump.capture.serving import sglang_version

    version = sglang_version()
    report = {
        "name": name,
        "command": " ".join([sys.executable] + sys.argv),
        "env": environment(dev),
        "sglang": version,
        "tp": tp,
        "runs": {},
    }
    out_json = Path(args.results_dir) / f"{name}.json"

    def save():
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(report, indent=1, default=str))

    mon = Monitor(gpus=tp)
    mon.start()
    report["gpu_memory"] = f"NVML used, summed over the first {tp} visible GPU(s)"
    ec = engine_config(dev, args.mem_fraction)
    if args.no_cuda_graph:
        ec.disable_cuda_graph = True
    if args.context_length:
        ec.extra["context_length"] = args.context_length
        os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    # FlashInfer's all-reduce fusion (a 3-minute JIT build at TP > 1) is off as in gpu.yaml:
    # serving.start_kwargs, which plain_kwargs and CaptureEngine apply
    report["weights"] = args.weights
    report["writer_opts"] = dict(WRITER_OPTS)
    report["engine_config"] = {k: getattr(ec, k) for k in ec.__dataclass_fields__}
    report["disk"] = disk_bandwidth(args.out_dir, args.dd_mib or (4096 if gpu else 256))
    print("disk:", json.dumps(report["disk"]))
    save()

    for spec in [s for s in args.models.split(",") if s]:
        parts = spec.split(":")
        mname = parts[0]
        seqs = [x if x == "sharegpt" else int(x) for x in parts[1].split("/")]
        small = mname in ("tiny-llama", "dsv3-small")
        if args.weights == "dummy":
            ec.extra["load_format"] = "dummy"
        t_build = time.time()
        model_path = build_model(mname, os.path.join(args.model_dir, mname), args.weights)
        build_s = time.time() - t_build
        info = read_model_info(model_path)
        layers = default_layers(mname, info.num_hidden_layers)
        stages_mib = (
            (1024 if gpu else 64) if args.writer_stages_mib is None else args.writer_stages_mib
        )
        if "writer_stages" not in report and stages_mib > 0:
            report["writer_stages"] = writer_stages(
                args.out_dir, stages_mib << 20, len(layers) * info.hidden_size
            )
            print("writer stages:", json.dumps(report["writer_stages"]))
        modes = [m for m in args.modes.split(",") if m]
        if "b8" in modes:
            cost = fp8_host_cost(info.hidden_size, len(layers))
            report.setdefault("fp8_host_quantize", {})[mname] = cost
            print("fp8 encode on the host:", json.dumps(cost))
        vocab = json.load(open(os.path.join(model_path, "config.json")))["vocab_size"]
        loads, runs = [], {}
        for seq in seqs:
            # default sizes: ~2M tokens (small models) or ~0.5M tokens (8B) per timed run;
            # the built-in path gets ~64k / ~16k tokens (its Python lists take ~30x the bytes)
            budget = args.tokens or ((2 << 20) if small else (1 << 19))
            lens = sharegpt_lengths() if seq == "sharegpt" else None
            if lens is not None:
                n = int(parts[2]) if len(parts) > 2 else _count_within(lens, budget)
                nc = (
                    int(parts[3])
                    if len(parts) > 3
                    else max(1, _count_within(lens, 65536 if small else 16384))
                )
                lens = lens[:n]
                g = torch.Generator().manual_seed(4321)
            else:
                n = int(parts[2]) if len(parts) > 2 else max(8, budget // seq)
                # past 8,192 tokens one sample's lists alone take > 10 GB: c is not run
                nc = (
                    int(parts[3])
                    if len(parts) > 3
                    else (
                        0 if seq > 8192 else max(2, 65536 // seq) if small else max(1, 16384 // seq)
                    )
                )
                lens = [seq] * n
                g = torch.Generator().manual_seed(4321 + seq)  # the warm-up's ids
            # fixed lengths: models.bench_ids, the ids another tool is given to time the same
            samples = (
                [torch.randint(10, vocab, (m,), generator=g).tolist() for m in lens]
                if seq == "sharegpt"
                else models.bench_ids(n, seq, vocab)
            )
            w_len = 2048 if seq == "sharegpt" else seq
            warm_n = max(2, 32768 // w_len) if gpu else 4
            warm = [torch.randint(10, vocab, (w_len,), generator=g).tolist() for _ in range(warm_n)]
            loads.append(Workload(seq, samples, warm, nc))
            key = f"{mname}:{seq}"
            runs[seq] = report["runs"][key] = {
                "model": mname,
                "model_path": model_path,
                "architecture": info.architecture,
                "hidden_size": info.hidden_size,
                "num_hidden_layers": info.num_hidden_layers,
                "seq": seq,
                "samples": n,
                "samples_builtin": nc,
                "layers": layers,
                "final": list(final),
                "weights": args.weights,
                "tp": tp,
                "tokens": loads[-1].tokens,
                "ids_sha256": speed.ids_digest(samples),  # what bench/speed_pair.py pairs on
                "repeat": repeat,
                "model_build_s": build_s,
            }
        engines = report.setdefault("engines", {}).setdefault(mname, {})
        # seconds a mode takes: a rough constant until one mode has run, then that mode's time
        est = 90 if small else 60 + 45 * len(seqs)
        for mode in modes:
            if mode == "b8" and "b" in modes:
                continue  # runs on b's engine, right after b
            starts = [e["engine_start_s"] for e in engines.values() if "engine_start_s" in e]
            if mode == "c" and starts:
                est = starts[-1] + 45  # an engine start like the last one, plus a few samples
            may_skip = args.deadline_modes is None or mode in args.deadline_modes.split(",")
            if args.deadline_s and may_skip and time.time() - t_start + est > args.deadline_s:
                engines[mode] = {"error": "skipped: deadline"}
                for seq in seqs:
                    runs[seq][mode] = {"error": "skipped: deadline"}
                print(f"[{mname}] mode {mode}: skipped (deadline)")
                continue
            print(f"[{mname}] mode {mode} ... (t={time.time() - t_start:.0f} s)", flush=True)
            t_mode = time.time()

            def partial(seq, res):  # b0, b, b8 saved as each ends
                runs[seq][mode] = dict(res)
                _ratios(runs[seq], report["disk"])
                save()

            def run_mode():
                if mode == "a":
                    return mode_plain(model_path, ec, loads, mon, repeat, tp)
                if mode in ("b", "b8"):
                    storages = ["bfloat16"] * (mode == "b") + ["fp8"] * ("b8" in modes)
                    return mode_hsdump(
                        model_path,
                        ec,
                        loads,
                        layers,
                        info,
                        args.out_dir,
                        mon,
                        repeat,
                        storages,
                        args.fp8_tokens,
                        partial,
                        tp,
                        final,
                    )
                if mode == "c":
                    return mode_builtin(
                        model_path, ec, loads, layers, info, version, mon, repeat, tp
                    )
                raise ValueError(f"unknown mode {mode}")

            try:
                try:
                    res = run_mode()
                except Exception as e:
                    # SGLang's dummy weights failed before anything ran: build weight files
                    # and try this mode again (the modes after it then use the files too)
                    if ec.extra.get("load_format") != "dummy" or engines:
                        raise
                    print(traceback.format_exc())
                    print(f"[{mname}] dummy weights failed; building weight files")
                    report.setdefault("dummy_fallback", {})[mname] = f"{type(e).__name__}: {e}"
                    ec.extra.pop("load_format")
                    t_build = time.time()
                    model_path = build_model(mname, os.path.join(args.model_dir, mname))
                    for seq in seqs:
                        runs[seq].update(
                            model_path=model_path,
                            weights="files",
                            model_build_s=time.time() - t_build,
                        )
                    res = run_mode()
                engines[mode] = res.pop("_engine")
                for seq in seqs:
                    runs[seq][mode] = res.get(seq, {"error": "not measured"})
            except Exception as e:
                err = {
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-3000:],
                }
                engines[mode] = err
                for seq in seqs:
                    runs[seq].setdefault(mode, err)
                print(traceback.format_exc())
            _wait_gpu_free(mon, (engines.get("a") or {}).get("baseline", {}).get("gpu_used_bytes"))
            est = time.time() - t_mode
            for seq in seqs:
                _ratios(runs[seq], report["disk"])
            save()
        for seq in seqs:
            print()
            print(table(name, runs[seq], tp))
        print(
            "engine start s: "
            + ", ".join(
                f"{m} {e.get('engine_start_s', float('nan')):.1f}" for m, e in engines.items()
            )
        )
        print()
    mon.stop()
    report["elapsed_s"] = time.time() - t_start
    save()
    print(f"wrote {out_json} ({report['elapsed_s']:.0f} s)")
    return 0


def _ratios(r: dict, disk: Optional[dict] = None) -> None:
    bm = r.get("b") or {}
    a = (r.get("a") or {}).get("tokens_per_s")
    b = (bm.get("b") or {}).get("tokens_per_s")
    b8 = (bm.get("b8") or {}).get("tokens_per_s")
    b0 = (bm.get("b0") or {}).get("tokens_per_s")
    c = (r.get("c") or {}).get("tokens_per_s")
    b_run = (bm.get("b") or {}).get("run_tokens_per_s")
    b8_run = (bm.get("b8") or {}).get("run_tokens_per_s")
    pairs = {
        "b/a": (b, a),
        "b_run/a": (b_run, a),
        "b0/a": (b0, a),
        "b/c": (b, c),
        "b8/a": (b8, a),
        "b8_run/a": (b8_run, a),
        "b8/b": (b8, b),
    }
    ra = {k: x / y for k, (x, y) in pairs.items() if x and y}
    # the disk: rows written per second against dd's conv=fdatasync rate on the same disk, and
    # the rate at which b0 produced rows against it (above 1: the disk cannot keep up)
    dd = (disk or {}).get("conv_fdatasync_bytes_per_s")
    bm, b8m = ((r.get("b") or {}).get("b") or {}), ((r.get("b") or {}).get("b8") or {})
    if dd and bm.get("bytes_written_per_s"):
        ra["b_written/dd_fdatasync"] = bm["bytes_written_per_s"] / dd
        if b0 and bm.get("bytes_per_token"):
            ra["b_rows_at_b0_rate/dd_fdatasync"] = b0 * bm["bytes_per_token"] / dd
    if dd and b8m.get("bytes_written_per_s"):
        ra["b8_written/dd_fdatasync"] = b8m["bytes_written_per_s"] / dd
        if b0 and b8m.get("bytes_per_token"):
            ra["b8_rows_at_b0_rate/dd_fdatasync"] = b0 * b8m["bytes_per_token"] / dd
    r["ratios"] = ra


def _wait_gpu_free(mon: Monitor, baseline: Optional[int], timeout: float = 30.0) -> None:
    """Engines free GPU memory asynchronously; wait until use is back near the baseline."""
    if baseline is None:
        return
    t = time.time()
    while time.time() - t < timeout:
        u = mon.gpu.used()
        if u is None or u < baseline + (2 << 30):
            return
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
