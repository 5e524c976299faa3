"""bench.py's report: the table printed per model and length, the ratios between the modes
and against the disk, and the environment a results file records."""

from __future__ import annotations

import datetime
import os
import re
from typing import Optional

import torch

from hsdump.testing import speed


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
