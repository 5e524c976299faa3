"""Which EAGLE-3 target families hsdump captures right: a real extraction per family, checked
against transformers.

For each family of `hsdump.testing.families` (or those named): build (or reuse) its tiny random
checkpoint, run hsdump's real path in a subprocess,

    python extract.py model.path=CKPT capture.layers=[1,L//2,L-1] dataset.max_samples=4 \
        output.dir=TMP engine=cpu|gpu capture.allow_unverified=true ...

with a time limit, read the stored rows back with `hsdump.store.reader.HsdumpDataset`, and compare
every stored tensor of layer k (hf_hidden_states_index) with transformers' float32
`output_hidden_states=True` `hidden_states[k]` of the same input_ids (the checkpoint's own
transformers class: a vision-language wrapper is run text-only). The verdict:
hsdump.testing.probe, by hsdump.check's per-sample rule: err <= 3 * bf16_err + 0.002 per sample and layer,
where bf16_err is transformers' own bf16-vs-float32 error on the same input, and `hsdump check`'s
neighbour verdict (hsdump.check.neighbours: the rows closest to index k, and the model's own
states at k and k +- 1 more than twice the rows' error apart). Errors against hidden_states[k-1]
and [k+1] are reported too, and for a failing layer the index the rows match best.

    .venv/bin/python bench/families_probe.py                      # all, CPU engine
    .venv/bin/python bench/families_probe.py llama gemma3 --timeout 300
    python3 bench/families_probe.py --device gpu --out results-gpu.json   # on a GPU machine

Status per family: ok; wrong-layer (the rows equal another index: the capture is shifted);
wrong (the rows match no index within tolerance); too-close (the neighbour verdict fails);
failed: <first error line> (the run did
not produce a dataset: the error is the root one found in the run's log, which is kept in the
work dir and its tail in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from bench import environment as bench_environment
from hsdump.check import PER_SAMPLE_EPS, PER_SAMPLE_FACTOR, hf_hidden_states
from hsdump.testing.families import FAMILIES, build, extract_overrides
from hsdump.testing.probe import compare, layers_for, outcome

ROOT = Path(__file__).resolve().parents[1]


def environment() -> dict:
    return bench_environment("cuda" if torch.cuda.is_available() else "cpu")


def run_extract(ckpt, name, layers, out_dir, device, samples, timeout, log_path, overrides):
    """extract.py on a family's checkpoint in a session of its own, its output in `log_path`;
    after `timeout` seconds it is killed with its SGLang processes (the process group).
    {"rc" (None on a timeout), "timed_out", "seconds", "log"}."""
    cmd = [sys.executable, str(ROOT / "extract.py"), "progress=false"]
    cmd += extract_overrides(ckpt, name, layers, device, samples)
    cmd += [f"output.dir={out_dir}", *overrides]
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1")
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc, timed_out = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, timed_out = None, True
    return {
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(time.time() - t0, 1),
        "log": Path(log_path).read_text(errors="replace"),
    }


# --------------------------------------------------------------------------- extraction
_ERR = re.compile(
    r"^\s*(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt)|AssertionError"
    r"|KeyError|NotImplementedError)\b:?(.*)$"
)
_GENERIC = ("EngineDied", "CaptureError", "ChildFailed", "SystemExit", "KeyboardInterrupt")


def root_error(log: str) -> str:
    """The most telling error line of a failed run, with the innermost code location of its
    traceback: the first exception line that is not one of hsdump's wrappers (an SGLang
    child's own traceback is printed before the parent notices the death), else an
    `[hsdump][ERROR]` message, else the last error-looking line."""
    lines = log.splitlines()
    errs, logged = [], []
    for i, ln in enumerate(lines):
        st = ln.strip()
        if _ERR.match(st) and not st.startswith("File "):
            errs.append(i)
        elif "][ERROR] - " in ln:
            logged.append(i)
    specific = [i for i in errs if not any(g in lines[i] for g in _GENERIC)]
    pick = (specific or [])[:1] or logged[:1] or errs[-1:]
    if not pick:
        tail = [ln for ln in lines if ln.strip()]
        return (tail[-1] if tail else "no output")[:400]
    i = pick[0]
    msg = lines[i].split("][ERROR] - ", 1)[-1].strip()
    frames, code = [], None  # innermost first, back to the start of this traceback
    for j in range(i - 1, max(i - 200, -1), -1):
        if lines[j].startswith("Traceback"):
            break
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', lines[j])
        if m:
            path = m.group(1).split("site-packages/", 1)[-1].replace(str(ROOT) + "/", "")
            frames.append(f"{path}:{m.group(2)} in {m.group(3)}")
            if code is None and j + 1 < len(lines):
                code = lines[j + 1].strip()
    if code and ":" not in msg:  # a bare `AssertionError`: show the failing statement
        msg += f" [{code}]"
    ours = [f for f in frames if f.startswith(("sglang/", "hsdump/"))]
    where = f" (at {(ours or frames)[0]})" if frames else ""
    return (msg[:300] + where)[:420]


# SGLang's model module per family: when it fails to import, SGLang's registry falls back to
# its transformers backend (TransformersForCausalLM), which has no EAGLE-3 capture
SGLANG_MODULE = {
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_text",
    "qwen3_5_vl": "qwen3_5",
    "qwen3_5_moe_vl": "qwen3_5",
    "gemma3": "gemma3_causal",
    "gemma3_vl": "gemma3_mm",
    "llama4": "mllama4",
    "llama4_text": "llama4",
    "deepseek_v3": "deepseek_v2",
    "deepseek_v32": "deepseek_v2",
    "phi3": "llama",
}


# extract.py overrides a family needs on the CPU engine (tests/test_families.py's CPU_OVERRIDES):
# SGLang's Gemma-4 refuses torch_native by name; intel_amx passes that check and falls back to
# torch_native on a CPU without AMX
CPU_OVERRIDES = {
    "gemma4_vl": ["engine.attention_backend=intel_amx"],
    "gemma4_unified": ["engine.attention_backend=intel_amx"],
}
# and on the GPU: the tiny Llama-4 and GPT-OSS configs keep the releases' long contexts, which
# SGLang's GPU engine sizes buffers for (0.5.17's probe, bench/results/families-cpu.json's
# gpu_preview, ran them with this override)
GPU_OVERRIDES = {
    "gpt_oss": ["+engine.extra.context_length=8192"],
    "llama4": ["+engine.extra.context_length=8192"],
    "llama4_text": ["+engine.extra.context_length=8192"],
}


def failure(name: str, log: str) -> str:
    why = root_error(log)
    mod = SGLANG_MODULE.get(name, name)
    m = re.search(rf"Ignore import error when loading sglang\.srt\.models\.{mod}: (.*)", log)
    if m and "TransformersForCausalLM" in why:
        why += f" [sglang.srt.models.{mod} failed to import: {m.group(1).strip()[:200]}]"
    return why


# --------------------------------------------------------------------------- one family
def probe(name: str, args, workdir: Path) -> dict:
    from hsdump.capture.layers import read_model_info

    fam = FAMILIES[name]
    res = {"family": name, "class": fam.cls, "device": args.device}
    t0 = time.time()
    try:
        ckpt = build(name)
    except Exception as e:  # noqa: BLE001
        res.update(
            status=f"failed: build: {type(e).__name__}: {e}"[:300],
            traceback=traceback.format_exc()[-3000:],
        )
        return res
    info = read_model_info(str(ckpt))
    layers = layers_for(info.num_hidden_layers)
    res.update(
        checkpoint=str(ckpt),
        num_layers=info.num_hidden_layers,
        hidden_size=info.hidden_size,
        layers=layers,
    )
    overrides = [*(CPU_OVERRIDES if args.device == "cpu" else GPU_OVERRIDES).get(name, [])]
    overrides += [o for o in args.override if o not in overrides]
    out_dir = workdir / f"ds-{name}"
    shutil.rmtree(out_dir, ignore_errors=True)
    log_path = workdir / f"{name}.log"
    run = run_extract(
        ckpt,
        name,
        layers,
        out_dir,
        args.device,
        args.samples,
        args.timeout,
        log_path,
        overrides,
    )
    if overrides:
        res["overrides"] = overrides
    res.update(
        extract_s=run["seconds"],
        rc=run["rc"],
        timed_out=run["timed_out"],
        log=str(log_path),
        log_tail=run["log"].splitlines()[-40:],
    )
    if run["rc"] != 0:
        why = (
            f"timeout after {args.timeout:.0f} s" if run["timed_out"] else failure(name, run["log"])
        )
        res["status"] = f"failed: {why}"
        return res
    try:
        from hsdump.store.reader import HsdumpDataset

        ds = HsdumpDataset(str(out_dir))
        assert list(ds.layers) == layers, (ds.layers, layers)
        records = {sid: ds.get(sid) for sid in ds.ids}
        ds.close()
        if not records:
            res["status"] = "failed: the dataset holds no samples"
            return res
        sids = sorted(records)
        prompts = [records[s]["input_ids"].tolist() for s in sids]
        dev = "cuda" if args.device == "gpu" and torch.cuda.is_available() else "cpu"
        r32 = hf_hidden_states(ckpt, prompts, torch.float32, dev, cls=fam.cls)
        r16 = hf_hidden_states(ckpt, prompts, torch.bfloat16, dev, cls=fam.cls)
        ref32 = dict(zip(sids, r32))
        ref16 = dict(zip(sids, r16))
        cmp = compare(records, layers, ref32, ref16)
    except Exception as e:  # noqa: BLE001
        res.update(
            status=f"failed: compare: {type(e).__name__}: {e}"[:300],
            traceback=traceback.format_exc()[-3000:],
        )
        return res
    res.update(outcome(cmp, prompts), total_s=round(time.time() - t0, 1))
    res.pop("log_tail")
    return res


def line(r: dict) -> str:
    st = r.get("status", "?")
    w = r.get("worst")
    b = r.get("bf16_worst")
    nb = r.get("neighbour_min")
    nums = f"worst {w:.4f}  bf16 {b:.4f}  neighbours >= {nb:.3f}" if w is not None else ""
    return f"{r['family']:<15} {r['class']:<36} {st[:110]:<40} {nums}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("families", nargs="*", help=f"default: all of {', '.join(FAMILIES)}")
    ap.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="engine=cpu (SGLang's CPU engine) or engine=gpu",
    )
    ap.add_argument(
        "--out", default=None, help="results JSON (default: bench/results/families-<device>.json)"
    )
    ap.add_argument("--timeout", type=float, default=240, help="seconds per family's run")
    ap.add_argument("--samples", type=int, default=4, help="dataset.max_samples")
    ap.add_argument("--workdir", default=None, help="datasets and logs (default: a temp dir)")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        help="one more extract.py override for every family (repeatable), e.g. "
        "engine.max_total_tokens=20000",
    )
    ap.add_argument(
        "--relabel",
        action="store_true",
        help="only recompute the failed families' statuses in --out from their logs",
    )
    ap.add_argument(
        "--merge", action="store_true", help="keep the other families' results already in --out"
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="families probed at once, each in its own process (a GPU has room for several tiny "
        "engines when each one's KV pool is capped: --override engine.max_total_tokens=N)",
    )
    args = ap.parse_args(argv)
    names = args.families or list(FAMILIES)
    bad = [n for n in names if n not in FAMILIES]
    if bad:
        ap.error(f"unknown families {bad}; known: {', '.join(FAMILIES)}")
    out = Path(args.out or ROOT / "bench" / "results" / f"families-{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hsdump-families-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = {
        "env": environment(),
        "device": args.device,
        "timeout_s": args.timeout,
        "samples": args.samples,
        "workdir": str(workdir),
        "tolerance": f"err <= {PER_SAMPLE_FACTOR} * bf16_err + {PER_SAMPLE_EPS} per sample "
        "and layer",
        "results": {},
    }
    if args.merge and out.exists():  # the other families' results and the file's other keys
        kept = json.loads(out.read_text())
        report = {
            **kept,
            **{k: v for k, v in report.items() if k != "results"},
            "results": kept.get("results", {}),
        }
    if args.relabel:
        report = json.loads(out.read_text())
        for name, r in report["results"].items():
            if (
                r.get("status", "").startswith("failed")
                and not r.get("timed_out")
                and r.get("log")
                and os.path.exists(r["log"])
            ):
                r["status"] = "failed: " + failure(name, Path(r["log"]).read_text(errors="replace"))
            print(line(r))
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        return 0
    print(f"work dir {workdir}; results -> {out}", flush=True)

    def record(r: dict) -> None:
        report["results"][r["family"]] = r
        print(line(r), flush=True)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    if args.jobs <= 1:
        for name in names:
            record(probe(name, args, workdir))
    else:  # spawned workers: each imports torch and touches CUDA on its own
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(probe, name, args, workdir): name for name in names}
            for f in as_completed(futs):
                try:
                    record(f.result())
                except Exception as e:  # noqa: BLE001  (a worker died: keep the others)
                    name = futs[f]
                    fam = FAMILIES[name]
                    record({"family": name, "class": fam.cls, "status": f"failed: worker: {e}"})
    print("\nfamily          class                                status")
    for r in report["results"].values():
        print(line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
