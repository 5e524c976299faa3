"""Which EAGLE-3 target families hsdump captures right: a real extraction per family, checked
against transformers.

For each family of `tests/families.py` (or those named): build (or reuse) its tiny random
checkpoint, run hsdump's real path in a subprocess,

    python extract.py model.path=CKPT capture.layers=[1,L//2,L-1] dataset.max_samples=4 \
        output.dir=TMP engine=cpu|gpu capture.allow_unverified=true ...

with a time limit, read the stored rows back with `hsdump.store.reader.HsdumpDataset`, and compare
every stored tensor of layer k (hf_hidden_states_index) with transformers' float32
`output_hidden_states=True` `hidden_states[k]` of the same input_ids (the checkpoint's own
transformers class: a vision-language wrapper is run text-only). Tolerance: tests/tolerance.py's
per-sample rule, as tests/test_engine.py: err <= 3 * bf16_err + 0.002 per sample and layer,
where bf16_err is transformers' own bf16-vs-float32 error on the same input. Errors against
hidden_states[k-1] and [k+1] are reported too, and for a failing layer the index the rows
match best.

    .venv/bin/python bench/families_probe.py                      # all, CPU engine
    .venv/bin/python bench/families_probe.py llama gemma3 --timeout 300
    python3 bench/families_probe.py --device gpu --out results-gpu.json   # on a GPU machine

Status per family: ok; wrong-layer (the rows equal another index: the capture is shifted);
wrong (the rows match no index within tolerance); failed: <first error line> (the run did
not produce a dataset: the error is the root one found in the run's log, which is kept in the
work dir and its tail in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from families import FAMILIES, build, hf_hidden_states, run_extract  # noqa: E402,F401
from gpu_check import environment  # noqa: E402
from tolerance import (  # noqa: E402
    MATCH_EPS,
    MATCH_FACTOR,
    PER_SAMPLE_EPS,
    PER_SAMPLE_FACTOR,
    moe_layer_failures,
    rel_err,
)


def layers_for(num_layers: int):
    return [1, num_layers // 2, num_layers - 1]


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


def compare(records, layers, ref32, ref16) -> dict:
    per = {str(k): {"err": [], "bf16": [], "prev": [], "next": [], "best": []} for k in layers}
    problems = []
    for sid, rec in records.items():
        r32, r16 = ref32[sid], ref16[sid]
        for j, k in enumerate(layers):
            h = rec["hidden_states"][j]
            d = per[str(k)]
            if tuple(h.shape) != tuple(r32[k].shape):
                problems.append(
                    f"sample {sid} layer {k}: shape {tuple(h.shape)} != {tuple(r32[k].shape)}"
                )
                continue
            d["err"].append(rel_err(h, r32[k]))
            d["bf16"].append(rel_err(r16[k], r32[k]))
            d["prev"].append(rel_err(h, r32[k - 1]))
            d["next"].append(rel_err(h, r32[k + 1]) if k + 1 < len(r32) else None)
            errs = [rel_err(h, r) for r in r32]
            best = min(range(len(errs)), key=errs.__getitem__)
            d["best"].append([best, errs[best]])
            if not torch.isfinite(h.float()).all():
                problems.append(f"sample {sid} layer {k}: non-finite values")
    status, detail = "ok", []
    for k in layers:
        d = per[str(k)]
        for e, s, (b, be) in zip(d["err"], d["bf16"], d["best"]):
            if e > PER_SAMPLE_FACTOR * s + PER_SAMPLE_EPS:
                if b != k and be <= MATCH_FACTOR * s + MATCH_EPS:
                    status = "wrong-layer"
                    detail.append(f"layer {k} rows match hf[{b}] ({be:.4f}), not hf[{k}] ({e:.4f})")
                else:
                    status = "wrong-layer" if status == "wrong-layer" else "wrong"
                    detail.append(
                        f"layer {k}: err {e:.4f} > {PER_SAMPLE_FACTOR} x bf16 "
                        f"{s:.4f} + {PER_SAMPLE_EPS}; best index hf[{b}] {be:.4f}"
                    )
                break
    if problems:
        status = "wrong"
    # tests/tolerance.py's MoE rule (tests/test_gpu.py's): per layer, mean err <= 2 x mean
    # bf16 err + 0.005 and every err <= 3 x the largest bf16 err + 0.005. In an MoE a
    # near-tied router flips experts for a few tokens in either bf16 run, so one prompt's bf16
    # error can be far below the engine's while others are above it.
    moe_ok = not problems
    lens = [len(rec["input_ids"]) for rec in records.values()]
    for k in layers:
        d = per[str(k)]
        if d["err"] and moe_layer_failures(k, d["err"], d["bf16"], lens):
            moe_ok = False
    summary = {}
    for k in layers:
        d = per[str(k)]
        if d["err"]:
            nxt = [x for x in d["next"] if x is not None]
            summary[str(k)] = {
                "worst": max(d["err"]),
                "bf16_worst": max(d["bf16"]),
                "prev_min": min(d["prev"]),
                "next_min": min(nxt) if nxt else None,
                "best_index": sorted({b for b, _ in d["best"]}),
                "err": d["err"],
                "bf16": d["bf16"],
            }
    return {
        "status": status,
        "moe_rule_ok": moe_ok,
        "detail": sorted(set(detail))[:6],
        "problems": problems[:6],
        "per_layer": summary,
        "raw": per,
    }


def outcome(cmp: dict, prompts) -> dict:
    """The verdict fields of a family's results from compare()'s. A family whose every row was
    refused before a comparison (transformers' rows of another shape: GLM-5-next's 4
    hyper-connection streams, say) is "wrong" with the problems, not a crash."""
    if not cmp["per_layer"]:
        return {"status": "wrong", "problems": cmp["problems"], "samples": len(prompts)}
    per = cmp["per_layer"].values()
    return {
        "status": cmp["status"],
        "moe_rule_ok": cmp["moe_rule_ok"],
        "detail": cmp["detail"],
        "problems": cmp["problems"],
        "per_layer": cmp["per_layer"],
        "samples": len(prompts),
        "sample_lens": [len(p) for p in prompts],
        "worst": max(v["worst"] for v in per),
        "bf16_worst": max(v["bf16_worst"] for v in per),
        "neighbour_min": min(min(v["prev_min"], v["next_min"] or 9e9) for v in per),
    }


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
        r32 = hf_hidden_states(ckpt, fam.cls, prompts, torch.float32, dev)
        r16 = hf_hidden_states(ckpt, fam.cls, prompts, torch.bfloat16, dev)
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
