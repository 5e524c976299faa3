"""Engine start time, itemised, per CUDA-graph setting (issue 13 item 5; docs/performance.md, "Engine start").

Each start runs in a fresh child process (`--child`), which imports hsdump's engine module
(and with it sglang), builds a `CaptureEngine` on the model, runs a first batch (8 x 2,048
tokens: one 16,384-token forward, where Triton compiles what graph capture did not), then
measures capture throughput (rows dropped by the sink) on three workloads: 64 x 2,048 tokens,
ShareGPT V3 lengths (about 131K tokens), and 32 single 256-token requests one after another
(small forwards, where a prefill CUDA graph could pay). This process stamps every line the
child and SGLang print with the time since the child was spawned, and finds SGLang's own
milestones in its info log: torch.distributed init, weight load, KV pool, each graph capture.

"cold" gives the child empty JIT caches (Triton, TorchInductor, FlashInfer, DeepGEMM, the
~/.cache of a fresh HOME): what a new machine pays. "warm" reuses the folder of the same
setting's cold run (or stock's): what every later start on that machine pays. Python's own .pyc files and
the OS page cache are warm in both (the bundle is already imported once by the model build).

Settings (engine.decode_cuda_graph / engine.prefill_cuda_graph_max_tokens):
  stock     SGLang's defaults: decode graphs (36 batch sizes) and prefill graphs (74 token
            sizes up to the 16,384-token chunk); hsdump before this change
  nodecode  no decode graphs, SGLang's prefill graphs
  prefill2k no decode graphs, prefill graphs up to 2,048 tokens
  capture   no decode graphs, no prefill graphs: conf/engine/gpu.yaml now, for a run that
            does not generate

    source .gpu/part1/install.sh || exit 1; export PYTHONPATH=.:$PYTHONPATH
    python3 bench/start_bench.py --plan capture:cold,capture:warm,stock:cold,stock:warm \
        --json $OUT/start.json --logs $OUT/start-logs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SETTINGS: Dict[str, dict] = {
    "stock": {"decode_cuda_graph": True, "prefill_cuda_graph_max_tokens": None},
    "nodecode": {"decode_cuda_graph": False, "prefill_cuda_graph_max_tokens": None},
    "prefill2k": {"decode_cuda_graph": False, "prefill_cuda_graph_max_tokens": 2048},
    "capture": {"decode_cuda_graph": None, "prefill_cuda_graph_max_tokens": 0},
}
CACHE_VARS = (
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "FLASHINFER_WORKSPACE_BASE",
    "DG_JIT_CACHE_DIR",
    "XDG_CACHE_HOME",
    "HOME",
    "CUDA_CACHE_PATH",
)
# SGLang's info-log milestones (0.5.17 and 0.5.23 spell them alike)
MARKS = {
    "dist_begin": r"Init torch distributed begin",
    "dist_end": r"Init torch distributed ends",
    "weights_begin": r"Load weight begin",
    "weights_end": r"Load weight end",
    "kv_end": r"Memory pool end",
    "ready_line": r"max_total_num_tokens=",
}
GRAPH = re.compile(r"Capture (.*?) (CUDA graph|cuda graph|\S+) (begin|end)\.")


# --------------------------------------------------------------------------- child
def child(a) -> int:
    t_spawn = float(os.environ["HSDUMP_START_T0"])

    def mark(name: str, **extra):
        print(
            "HSDUMP_MARK " + json.dumps({"mark": name, "t": time.time() - t_spawn, **extra}),
            flush=True,
        )

    import torch

    import bench
    from hsdump.capture.layers import read_model_info, resolve_layers

    mark("python")
    bench._prepare(a.device)
    import sglang.srt.entrypoints.engine  # noqa: F401  (what CaptureEngine imports first)

    from hsdump.capture import (
        engine,  # noqa: F401  (hsdump's engine module, timed here)
        serving,
    )
    from hsdump.capture.base import Request
    from hsdump.capture.start import start

    mark("imported")
    info = read_model_info(a.model_path)
    layers = resolve_layers(None, None, info.num_hidden_layers)
    ec = dataclasses.replace(
        bench.engine_config(a.device, 0.5),
        log_level="info",
        extra={"load_format": "dummy"} if a.dummy else {},
        **SETTINGS[a.child],
    )
    mark("engine_kwargs", kwargs=serving.start_kwargs(ec, generates=False))
    eng = start(a.model_path, layers, ec, info=info)
    mark("ready")
    g = torch.Generator().manual_seed(0)
    hi = min(info.vocab_size, 30000)

    def prompts(lens):
        return [torch.randint(100, hi, (n,), generator=g).tolist() for n in lens]

    base = [0]

    def timed(samples, one_by_one=False):
        got = [0]

        def sink(s):
            got[0] += len(s.input_ids)

        t = time.perf_counter()
        batches = [[s] for s in samples] if one_by_one else [samples]
        for b in batches:
            eng.run([Request(base[0] + i, s) for i, s in enumerate(b)], sink)
            base[0] += len(b)
        dt = time.perf_counter() - t
        n = sum(len(s) for s in samples)
        assert got[0] == n, (got[0], n)
        return {"tokens": n, "s": dt, "tok_per_s": n / dt}

    k = 1 if a.device == "cuda" else 16  # the CPU check runs a 16th of the work
    res = {"setting": a.child, "first_batch": timed(prompts([2048 // k] * 8))}
    mark("first_batch")
    lens = bench.sharegpt_lengths()
    share = [min(n, 2048) for n in lens[: bench._count_within(lens, 131072 // k)]]
    res["fixed_2048"] = timed(prompts([2048 // k] * 64))
    res["sharegpt"] = timed(prompts(share))
    res["small_256"] = timed(prompts([256 // k] * 32), one_by_one=True)
    t = time.perf_counter()
    eng.close()
    res["close_s"] = time.perf_counter() - t
    mark("closed")
    print("HSDUMP_RESULT " + json.dumps(res), flush=True)
    return 0


# --------------------------------------------------------------------------- parent
def one_start(
    setting: str,
    cache: str,
    model_path: str,
    dummy: bool,
    log_path: Path,
    timeout_s: float,
    device: str = "cuda",
) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for v in CACHE_VARS:
        env[v] = os.path.join(cache, v.lower())
        os.makedirs(env[v], exist_ok=True)
    env.pop("SGLANG_LOG_LEVEL", None)
    t0 = time.time()
    env["HSDUMP_START_T0"] = repr(t0)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        setting,
        "--device",
        device,
        "--model-path",
        model_path,
    ] + (["--dummy"] if dummy else [])
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    lines: List[tuple] = []

    def pump():
        for line in p.stdout:
            lines.append((time.time() - t0, line.rstrip("\n")))

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        rc = p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        rc = "timeout"
    th.join(10)
    with open(log_path, "w") as f:
        for t, line in lines:
            f.write(f"{t:8.2f} {line}\n")
    out = {"setting": setting, "rc": rc, "log": str(log_path)}
    out.update(parse(lines))
    return out


def parse(lines: List[tuple]) -> dict:
    """Milestones (seconds since spawn) and stage durations from a stamped child log."""
    t: Dict[str, float] = {}
    graphs: List[dict] = []
    result = None
    for ts, line in lines:
        if line.startswith("HSDUMP_MARK "):
            m = json.loads(line[len("HSDUMP_MARK ") :])
            t[m["mark"]] = m["t"]
            continue
        if line.startswith("HSDUMP_RESULT "):
            result = json.loads(line[len("HSDUMP_RESULT ") :])
            continue
        for k, pat in MARKS.items():
            if k not in t and re.search(pat, line):
                t[k] = ts
        g = GRAPH.search(line)
        if g:
            el = re.search(r"elapsed=([0-9.]+)", line)
            graphs.append(
                {
                    "what": g.group(1),
                    "edge": g.group(3),
                    "t": ts,
                    "elapsed": float(el.group(1)) if el else None,
                }
            )
    st: Dict[str, Optional[float]] = {}

    def span(a, b):
        return round(t[b] - t[a], 2) if a in t and b in t else None

    st["python_torch_s"] = t.get("python")
    st["import_sglang_s"] = span("python", "imported")
    st["to_scheduler_s"] = span("engine_kwargs", "dist_begin")  # tokenizer mgr, spawn, imports
    st["dist_init_s"] = span("dist_begin", "dist_end")
    st["dist_to_weights_s"] = span("dist_end", "weights_begin")
    st["weights_s"] = span("weights_begin", "weights_end")
    st["kv_pool_s"] = span("weights_end", "kv_end")
    ends = [g_ for g_ in graphs if g_["edge"] == "end"]
    st["graph_capture_s"] = round(sum(g_["elapsed"] or 0 for g_ in ends), 2)
    st["graphs"] = [f"{g_['what']}: {g_['elapsed']} s" for g_ in ends]
    st["engine_ready_s"] = span("engine_kwargs", "ready")  # the engine's construction
    st["start_to_ready_s"] = t.get("ready")  # spawn to ready: what `hsdump extract` waits
    st["first_batch_s"] = span("ready", "first_batch")
    st["start_to_first_batch_s"] = t.get("first_batch")
    last = max(
        [t[k] for k in ("kv_end", "weights_end") if k in t] + [g_["t"] for g_ in ends] or [0]
    )
    st["after_last_milestone_s"] = round(t["ready"] - last, 2) if "ready" in t and last else None
    return {"stages": st, "marks": {k: round(v, 2) for k, v in t.items()}, "result": result}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--dummy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: a plumbing check on the tiny model (SGLang's CPU engine)",
    )
    ap.add_argument(
        "--plan",
        default="capture:cold,capture:warm,stock:cold,stock:warm",
        help="setting:cold|warm, in order (warm reuses that setting's cold caches)",
    )
    ap.add_argument("--model", default="llama8b")
    ap.add_argument("--weights", default="dummy", choices=("dummy", "files"))
    ap.add_argument("--models-dir", default="/tmp/hsdump-bench-models")
    ap.add_argument("--cache-root", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None)
    ap.add_argument("--timeout-s", type=float, default=240)
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=0,
        help="skip the starts left once this many seconds have passed",
    )
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    import bench

    t_all = time.time()
    if a.device == "cpu":
        a.model, a.weights = "tiny-llama", "files"
    model = bench.build_model(a.model, f"{a.models_dir}/{a.model}", a.weights)
    root = a.cache_root or tempfile.mkdtemp(prefix="hsdump-start-")
    logs = Path(a.logs or os.path.join(root, "logs"))
    logs.mkdir(parents=True, exist_ok=True)
    report = {"model": a.model, "weights": a.weights, "plan": a.plan, "starts": []}
    caches: Dict[str, str] = {}
    for i, item in enumerate(a.plan.split(",")):
        setting, state = item.split(":")
        if a.deadline_s and time.time() - t_all > a.deadline_s:
            report["starts"].append({"setting": setting, "state": state, "skipped": "deadline"})
            continue
        if state == "cold":
            caches[setting] = os.path.join(root, f"cache-{i}-{setting}")
            shutil.rmtree(caches[setting], ignore_errors=True)
        elif setting not in caches:  # warm with no cold run of its own: stock's caches
            caches[setting] = caches.get("stock") or list(caches.values())[-1]
        r = one_start(
            setting,
            caches[setting],
            model,
            a.weights == "dummy",
            logs / f"{i}-{setting}-{state}.log",
            a.timeout_s,
            a.device,
        )
        r["state"] = state
        report["starts"].append(r)
        print(json.dumps({k: r.get(k) for k in ("setting", "state", "rc", "stages")}), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


def table(report: dict) -> str:
    cols = [
        ("spawn to ready s", "start_to_ready_s"),
        ("import sglang", "import_sglang_s"),
        ("to scheduler", "to_scheduler_s"),
        ("dist init", "dist_init_s"),
        ("weights", "weights_s"),
        ("KV pool", "kv_pool_s"),
        ("graph capture", "graph_capture_s"),
        ("first 16K batch s", "first_batch_s"),
        ("spawn to first batch s", "start_to_first_batch_s"),
    ]
    head = (
        "| setting | caches | "
        + " | ".join(c for c, _ in cols)
        + " | 2,048 x 64 tok/s | ShareGPT tok/s | 256 one by one tok/s |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in report["starts"]:
        if "stages" not in r:
            rows.append(f"| {r['setting']} | {r['state']} | skipped ({r.get('skipped')}) |")
            continue
        st, res = r["stages"], r.get("result") or {}
        vals = [st.get(k) for _, k in cols]
        tp = [res.get(k, {}).get("tok_per_s") for k in ("fixed_2048", "sharegpt", "small_256")]
        rows.append(
            f"| {r['setting']} | {r['state']} | "
            + " | ".join("-" if v is None else f"{v:.1f}" for v in vals)
            + " | "
            + " | ".join("-" if v is None else f"{v:,.0f}" for v in tp)
            + " |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
