"""bench.py's measurements around the engines: peak host memory (summed RSS of the process
tree) and GPU memory (NVML), sampled by `Monitor`; where the host's CPU went in a window
(`cpu_window`); the output disk's write bandwidth (dd) and the writer thread's serial stages."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch


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
