"""Kimi-K2.5 as its checkpoint really is, through `extract.py model=kimi_k25`, against transformers.

Builds a tiny checkpoint laid out as moonshotai/Kimi-K2.5 is (tests/kimi_checkpoint.py:
KimiK25ForConditionalGeneration wrapping a 61-layer DeepSeek-V3 text model, a MoonViT tower,
Kimi's tiktoken tokenizer files, with --int4 the routed experts compressed-tensors
pack-quantized INT4 group 32), runs the preset with no other override than the model folder

    python extract.py model=kimi_k25 engine=gpu model.tp_size=1 model.path=CKPT \
        dataset.max_samples=50 output.dir=OUT

then `hsdump verify OUT`, and compares every stored layer (the preset's [3, 31, 59]) with a
float32 transformers DeepseekV3ForCausalLM forward of the same text weights (for INT4: the
dequantized values) by the project's MoE rule (tests/tolerance.py's tolerance_failures, as
tests/test_gpu.py: per layer, the mean error <= 2 x transformers' own mean bf16 error + 0.005,
and every sample's <= 3 x the largest bf16 error + 0.005; routing in bf16 flips experts on
near-ties, so the dense families' per-sample rule is too tight for MoE). The neighbouring
indices' errors and the index each sample matches best are reported too
(bench/families_probe.compare).

    python3 bench/kimi_check.py [--int4] [--tp 2 --dp-attention] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests", ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
from families import hf_hidden_states  # noqa: E402
from families_probe import compare  # noqa: E402
from gpu_check import environment  # noqa: E402
from kimi_checkpoint import build, reference_dir, write_kimi_tokenizer  # noqa: E402
from tolerance import tolerance_failures  # noqa: E402


def run(
    int4: bool,
    workdir: Path,
    tp: int = 1,
    dp_attention: bool = False,
    samples: int = 50,
    device: str = "gpu",
    num_layers: int = 61,
    overrides: tuple = (),
) -> dict:
    ckpt = workdir / ("kimi-int4" if int4 else "kimi-bf16")
    t0 = time.time()
    if not (ckpt / "config.json").exists():
        build(ckpt, write_kimi_tokenizer, int4=int4, num_layers=num_layers)
    if not (ckpt / "chat_template.jinja").exists():
        # moonshotai/Kimi-K2.5 ships its template as chat_template.jinja beside
        # tokenizer_config.json, and `model=kimi_k25 model.path=<ckpt>` takes the checkpoint's
        # own; the tiny checkpoint gets hsdump's copy of it (hsdump/corpus/templates)
        from hsdump.corpus.chat import template_path

        (ckpt / "chat_template.jinja").write_text(template_path("kimi_k25.jinja").read_text())
    res = {
        "int4": int4,
        "tp": tp,
        "dp_attention": dp_attention,
        "checkpoint": str(ckpt),
        "build_s": round(time.time() - t0, 1),
    }
    out = workdir / f"ds-{ckpt.name}-tp{tp}{'-dpa' if dp_attention else ''}"
    cmd = [
        sys.executable,
        str(ROOT / "extract.py"),
        "model=kimi_k25",
        f"engine={device}",
        f"model.tp_size={tp}",
        f"model.path={ckpt}",
        f"dataset.max_samples={samples}",
        f"output.dir={out}",
        "output.overwrite=true",
        "progress=false",
    ]
    if dp_attention:
        cmd += [f"+engine.extra.dp_size={tp}", "+engine.extra.enable_dp_attention=true"]
    cmd += list(overrides)
    res["cmd"] = " ".join(cmd[1:])
    t0 = time.time()
    log = workdir / f"extract-{out.name}.log"  # written as it runs: a run cut short keeps it
    res["log"] = str(log)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, text=True)
    res.update(extract_rc=proc.returncode, extract_s=round(time.time() - t0, 1))
    if proc.returncode != 0:
        res.update(status="failed: extract", log_tail=log.read_text(errors="replace")[-4000:])
        return res
    v = subprocess.run(
        [sys.executable, "-m", "hsdump", "verify", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    res.update(verify_rc=v.returncode, verify=(v.stdout + v.stderr)[-600:])

    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(str(out))
    layers = list(ds.layers)
    records = {sid: ds.get(sid) for sid in ds.ids}
    ds.close()
    sids = sorted(records)
    prompts = [records[s]["input_ids"].tolist() for s in sids]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = reference_dir(ckpt)
    r32 = dict(
        zip(sids, hf_hidden_states(ref, "DeepseekV3ForCausalLM", prompts, torch.float32, dev))
    )
    r16 = dict(
        zip(sids, hf_hidden_states(ref, "DeepseekV3ForCausalLM", prompts, torch.bfloat16, dev))
    )
    cmp = compare(records, layers, r32, r16)
    moe = {
        "sglang_vs_hf_fp32": {k: d["err"] for k, d in cmp["raw"].items()},
        "hf_bf16_vs_hf_fp32": {k: d["bf16"] for k, d in cmp["raw"].items()},
        "prompt_lens": [len(p) for p in prompts],
        "problems": cmp["problems"],
    }
    failures = tolerance_failures(moe)
    best = sorted({b for d in cmp["raw"].values() for b, _ in d["best"]})
    status = "ok" if not failures and best == sorted(layers) else "wrong"
    res.update(
        status=status if v.returncode == 0 else "verify failed",
        failures=failures[:6],
        per_layer=cmp["per_layer"],
        mean={
            k: [sum(d["err"]) / len(d["err"]), sum(d["bf16"]) / len(d["bf16"])]
            for k, d in cmp["raw"].items()
        },
        layers=layers,
        samples=len(records),
        tokens=sum(map(len, prompts)),
    )
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--int4", action="store_true", help="INT4 routed experts")
    ap.add_argument("--both", action="store_true", help="bf16 and INT4, one after the other")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dp-attention", action="store_true")
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None, help="results JSON")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        help="one more extract.py override (repeatable), e.g. engine.max_total_tokens=65536 "
        "to share the GPU with other checks",
    )
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hsdump-kimi-"))
    report = {"env": environment(), "runs": []}
    for int4 in [False, True] if args.both else [args.int4]:
        r = run(int4, workdir, args.tp, args.dp_attention, args.samples, overrides=args.override)
        report["runs"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "log_tail"}, default=str), flush=True)
        if "log_tail" in r:
            print(r["log_tail"], flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0 if all(r["status"] == "ok" for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
