"""SpecForge 0.2.0's own trainer and export on hsdump's records: the run config from its
recipe, the held-out split, the warm start of EAGLE-3's head, a trainer that dies resumed from
its newest checkpoint, its logged metrics parsed, and what they predict of the served accept
length (`python3 -m bench.acceptance train|export`). Both start SpecForge's CLI as
`python -m bench.acceptance.specforge_cli`, which applies hsdump's patches in its process."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from hsdump.online.consumer import TIED_HEAD_KEY, tied_head

from .drafter import EXPORT_TO, SERVED_STEPS, TRAINING
from .patches import draft_options
from .pipeline import package_env
from .pipeline import python_cmd as _py
from .target import trainer_target


def split_records(export: Path, dest: Path, eval_samples: int, dtype: str = "bfloat16") -> tuple:
    """Train and eval folders of links to the export's records: the last `eval_samples`
    (in hsdump id order) are held out for SpecForge's own evaluation (its eval loop reads
    `data.eval_hidden_states_path`), the rest are trained on. For a float32 trainer (the CPU's)
    the records are copies with their float tensors cast: SpecForge feeds them to the drafter
    as they are stored, and a bf16 state into a float32 layer is an error."""
    import torch

    cast = getattr(torch, dtype)
    files = sorted(export.glob("rows_*/data_*.ckpt"), key=lambda p: int(p.stem.split("_")[1]))
    if len(files) <= eval_samples:
        raise SystemExit(f"{export}: {len(files)} records, not more than --eval-samples")
    for name, part in (("train", files[:-eval_samples] if eval_samples else files),
                       ("eval", files[-eval_samples:] if eval_samples else [])):  # fmt: skip
        d = dest / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for f in part:
            if dtype == "bfloat16":
                (d / f.name).symlink_to(f.resolve())
                continue
            rec = torch.load(f, map_location="cpu", weights_only=True)
            torch.save({k: v.to(cast) if v.is_floating_point() else v for k, v in rec.items()},
                       d / f.name)  # fmt: skip
    return dest / "train", (dest / "eval") if eval_samples else None, len(files) - eval_samples


def run_config(a, kind: str, train_dir: Path, eval_dir, n_train: int, out: Path) -> dict:
    """SpecForge's typed run config (offline, one process): the recipe's optimiser settings;
    `--attention-backend` (sdpa: no torch.compile; flex_attention: SpecForge's default); a
    checkpoint and an evaluation on the held-out records every `--save-interval` steps (0:
    every half epoch), so a run stopped by the budget still has one to serve, and its
    prediction; with `--profile-at N` SpecForge's own profiler over steps N..N+3."""
    per_epoch = max(1, n_train // a.batch_size)
    tr = dict(
        strategy=kind,
        num_epochs=a.epochs,
        batch_size=a.batch_size,
        attention_backend=a.attention_backend,
        save_interval=a.save_interval or max(1, per_epoch // 2),
        log_interval=a.log_interval,
        seed=0,
        **TRAINING[kind],
    )
    if getattr(a, "learning_rate", None):
        tr["learning_rate"] = a.learning_rate
    if getattr(a, "ttt_length", None):
        if kind != "eagle3":
            raise SystemExit(f"--ttt-length is EAGLE-3's (its unrolled draft steps), not {kind}'s")
        tr["ttt_length"] = a.ttt_length
    if a.max_steps:
        tr["max_steps"] = a.max_steps
    if getattr(a, "keep_checkpoints", 0):
        tr["max_checkpoints"] = a.keep_checkpoints
    if eval_dir is not None:  # with each checkpoint: the prediction of the served step
        tr["eval_interval"] = min(tr["save_interval"], a.max_steps or per_epoch)
    if a.cpu:  # FSDP needs an accelerator; SpecForge's NO_SHARD is DDP, which runs on gloo
        tr["fsdp_sharding"] = "NO_SHARD"
    target = trainer_target(a.target, out / "target")
    model = dict(
        target_model_path=target,
        draft_model_config=str(Path(a.draft_config).resolve()),
        torch_dtype=train_dtype(a),
    )
    if tied_head(dict(target_model_path=a.target)):  # SmolLM2: the LM head is the embedding
        model["lm_head_key"] = TIED_HEAD_KEY
    data = dict(
        hidden_states_path=str(train_dir),
        max_length=a.max_length,
        dataloader_num_workers=a.num_workers,
        cache_dir=str(out / "cache"),
    )
    if eval_dir is not None:
        data["eval_hidden_states_path"] = str(eval_dir)
    cfg = dict(model=model, data=data, training=tr, run_id=kind, output_dir=str(out / "run"))
    if getattr(a, "profile_at", 0):
        cfg["profiling"] = dict(enabled=True, start_step=int(a.profile_at), num_steps=4)
    return cfg


def train_dtype(a) -> str:
    """The trainer's `model.torch_dtype`: `--dtype`, else bfloat16 on a GPU and, with `--cpu`,
    float32 for DFlash and DSpark: a CPU without native bf16 (AVX2 only) runs bf16 matmuls on
    a scalar path, 40x slower than float32 (a 129k-row LM head's forward and backward: 19.9 s
    against 0.53 s). EAGLE-3 stays bf16: SpecForge 0.2.0 loads its target head in bf16 only."""
    kind = getattr(a, "kind", None)
    dtype = getattr(a, "dtype", None)
    if dtype == "float32" and kind == "eagle3":
        raise SystemExit("--dtype float32: SpecForge 0.2.0 loads EAGLE-3's target head in bf16 "
                         "only, so its drafter trains in bfloat16; drop --dtype")  # fmt: skip
    return dtype or ("float32" if a.cpu and kind in ("dflash", "dspark") else "bfloat16")


STEP_LINE = re.compile(r"^step (\d+): (\{.*\})\s*$")
RESUME_LINE = re.compile(r"^hsdump: resuming from the checkpoint at step (\d+)\b")


def trainer_metrics(log: Path) -> list:
    """SpecForge's own `step N: {...}` lines (its tracker with report_to=none), parsed. After
    `train`'s resume marker (a trainer that died, resumed from its checkpoint at step N) the
    dead run's rows past N are dropped: the resumed run logs those steps again."""
    rows = []
    for line in log.read_text(errors="replace").splitlines():
        r = RESUME_LINE.match(line.strip())
        if r:
            rows = [x for x in rows if x["step"] <= int(r.group(1))]
            continue
        m = STEP_LINE.match(line.strip())
        if not m:
            continue
        try:
            d = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            continue
        rows.append(dict(step=int(m.group(1)), **d))
    return rows


def predicted_accept_length(kind: str, rows: list, tail: int = 20, upto=None) -> dict:
    """What SpecForge's trainer itself predicts, beside the served accept length:
    EAGLE-3: 1 + sum over the 3 served steps of the product of its eval per-position
    accuracies (accept length of a chain of 3 drafts, top-1); DSpark: its `tau_probabilistic`
    (the expected accepted block prefix), eval if logged, else the mean of the last `tail`
    training steps; DFlash: SpecForge 0.2.0's DFlash strategy logs token accuracy only, so
    none here (`predict` counts it on the served folder, and run-all puts that in its place).
    `upto`: the served checkpoint's step (later logs are left out)."""
    rows = [r for r in rows if upto is None or r["step"] <= upto]
    ev = [r for r in rows if any(k.startswith("eval/") for k in r)]
    last_eval = ev[-1] if ev else {}
    out = dict(eval=last_eval, source=None, predicted=None)
    if kind == "eagle3" and last_eval.get("eval/per_position_acc"):
        acc, p, total = last_eval["eval/per_position_acc"], 1.0, 1.0
        for x in acc[:SERVED_STEPS]:
            p *= float(x)
            total += p
        out.update(predicted=round(total, 4), source="eval/per_position_acc, 3 steps")
    elif kind == "dspark":
        if "eval/tau_probabilistic" in last_eval:
            out.update(predicted=last_eval["eval/tau_probabilistic"], source="eval/tau")
        else:
            taus = [r["tau_probabilistic"] for r in rows if "tau_probabilistic" in r][-tail:]
            if taus:
                out.update(predicted=round(sum(taus) / len(taus), 4),
                           source=f"train tau_probabilistic, mean of last {len(taus)} logs")  # fmt: skip
    return out


def head_init(a, cfg: dict, train_dir: Path, dest: Path) -> dict:
    """EAGLE-3's drafter started with the target's LM head, as speculators' trainer starts its
    own (its rows for the draft vocabulary); SpecForge 0.2.0 starts the drafter's head random
    and learns all of it from the records. The vocabulary map is the one SpecForge's trainer
    builds from the same records (its own `count_effective_feature_tokens` and
    `process_token_dict_to_mappings`), so only the head's start differs. Written as a
    pretrained draft folder and a map file, SpecForge's own `model.draft_checkpoint_path`
    (a weights-only warm start, every weight but the embedding required) and
    `model.vocab_mapping_path`: what run.json's model section gets."""
    import torch
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.model_loading import load_draft_config_source
    from specforge.training.vocab_mapping import count_effective_feature_tokens

    draft_options.apply()
    if a.kind != "eagle3":
        raise SystemExit(f"--head-init {a.head_init} is EAGLE-3's (its drafter has an LM head "
                         f"of its own); {a.kind} reads the target's: leave it at random")  # fmt: skip
    conf = load_draft_config_source(str(a.draft_config))
    vocab, draft_vocab = int(conf.vocab_size), int(conf.draft_vocab_size)
    if draft_vocab < vocab:
        counts = count_effective_feature_tokens(str(train_dir), max_length=a.max_length,
                                                target_vocab_size=vocab)  # fmt: skip
        # SpecForge's d2t; its t2d is `i in used_tokens` for each of the target's ids, a list
        # scan (129k x 32k: 35 s of CPU), so it is asked for none and t2d is made from d2t
        d2t, _ = process_token_dict_to_mappings(counts, draft_vocab, 0)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[torch.arange(draft_vocab) + d2t] = True
    else:  # SpecForge maps nothing: the draft vocabulary is the target's
        d2t, t2d = torch.zeros(vocab, dtype=torch.long), torch.ones(vocab, dtype=torch.bool)
    # the target's head as SpecForge's trainer reads it (its own loader, on the CPU here)
    target = TargetHead(cfg["model"]["target_model_path"])
    target.load_weights(cfg["model"]["target_model_path"],
                        lm_head_key=cfg["model"].get("lm_head_key", "lm_head.weight"))  # fmt: skip
    head = target.fc.weight
    torch.manual_seed(0)
    model = AutoDraftModel.from_config(
        conf, attention_backend=a.attention_backend, torch_dtype=torch.bfloat16
    )  # as the trainer loads it
    ids = torch.arange(draft_vocab) + d2t  # draft id i is target id i + d2t[i]
    with torch.no_grad():
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        model.lm_head.weight.copy_(head[ids].to(model.lm_head.weight.dtype))
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest))
    torch.save({"d2t": d2t, "t2d": t2d}, dest / "vocab_mapping.pt")
    return dict(draft_checkpoint_path=str(dest.resolve()),
                vocab_mapping_path=str((dest / "vocab_mapping.pt").resolve()))  # fmt: skip


def train(a) -> int:
    dtype = train_dtype(a)  # a float32 EAGLE-3 is refused here, before anything is written
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train_dir, eval_dir, n = split_records(Path(a.data), out / "records", a.eval_samples, dtype)
    cfg = run_config(a, a.kind, train_dir, eval_dir, n, out)
    init = getattr(a, "head_init", "random")
    if init.startswith("target"):
        cfg["model"].update(head_init(a, cfg, train_dir, out / "head-init"))
    (out / "run.json").write_text(json.dumps(cfg, indent=1) + "\n")
    # SpecForge's CLI with hsdump's patches (specforge_cli.py): the drafter's options; the CPU
    # rehearsal's EAGLE-3 loss without the Triton kernel; the frozen head; Muon
    flags = (["--cpu"] if a.cpu and a.kind == "eagle3" else []) + (
        ["--freeze-head"] if init == "target-frozen" else []) + (
        ["--muon"] if getattr(a, "optimizer", "adamw") == "muon" else [])  # fmt: skip
    cmd = _py("-m", "bench.acceptance.specforge_cli", *flags, "train", "--config", out / "run.json")
    print("specforge train --config " + str(out / "run.json"), flush=True)
    log = out / "train.log"
    # a budget stop (SIGTERM to the process group) reaches SpecForge, which unwinds and exits;
    # this wrapper waits for that and records what it logged
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(time.time()))
    copy = Path(a.log_copy) if a.log_copy else None
    rc, resumed = tee_call(cmd, log, copy), []
    # a trainer that dies (a CUDA fault, a killed process) is resumed from its newest
    # checkpoint, SpecForge's full state (weights, optimizer, data position), --retries times
    while rc != 0 and not stopped and len(resumed) < a.retries:
        ckpts = sorted(checkpoints(out / "run"))
        if not ckpts:
            break
        at, path = ckpts[-1]
        rows = trainer_metrics(log)
        resumed.append(dict(rc=rc, last_logged_step=rows[-1]["step"] if rows else None,
                            from_step=at, checkpoint=path.name))  # fmt: skip
        # the warm start is in the checkpoint now (SpecForge refuses both at once)
        cfg["model"].pop("draft_checkpoint_path", None)
        cfg["training"]["resume_from"] = str(path.resolve())
        (out / "run.json").write_text(json.dumps(cfg, indent=1) + "\n")
        note = (f"hsdump: resuming from the checkpoint at step {at} ({path.name}): SpecForge's "
                f"trainer exited {rc}; try {len(resumed)} of {a.retries}\n")  # fmt: skip
        print(note, end="", flush=True)
        rc = tee_call(cmd, log, copy, note=note)
    rows = trainer_metrics(log)
    # SpecForge exits 143 when the budget stops it: the run is over as planned, not failed
    by_budget = bool(stopped) and rc in (143, -signal.SIGTERM)
    res = dict(kind=a.kind, rc=rc, stopped_by_budget=by_budget, samples=n, resumed=resumed,
               eval_samples=a.eval_samples, config=cfg,
               steps=rows[-1]["step"] if rows else 0, last=rows[-1] if rows else None,
               eval_curve=eval_curve(rows), step_time=step_time(rows),
               **predicted_accept_length(a.kind, rows))  # fmt: skip
    (out / "train.json").write_text(json.dumps(res, indent=1) + "\n")
    keys = ("kind", "rc", "stopped_by_budget", "steps", "predicted", "source")
    print(json.dumps({k: res[k] for k in keys}))
    return 0 if by_budget else rc


PROGRESS = re.compile(r"(it/s|s/it)\]\s*$")


def tee_call(cmd, log: Path, copy=None, note=None) -> int:
    """Run `cmd`, its output into `log` and, as it comes, into `copy` without the progress
    bars' lines (the copy is what the GPU host's poll sends back while the run goes on).
    With `note` (a resumed run) both are appended to, after that line."""
    mode = "a" if note else "w"
    with open(log, mode) as f, open(copy, mode) if copy else open(os.devnull, "w") as g:
        if note:
            f.write(note)
            g.write(note)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", bufsize=1, env=package_env())  # fmt: skip
        for line in p.stdout:
            f.write(line)
            if not PROGRESS.search(line):
                g.write(line)
                g.flush()
        return p.wait()


def eval_curve(rows: list) -> list:
    """SpecForge's evaluations as logged: step, held-out loss and accuracy (and DSpark's tau)."""
    keep = ("eval/avg_loss", "eval/avg_acc", "eval/tau_probabilistic")
    return [dict(step=r["step"], **{k.split("/", 1)[1]: r[k] for k in keep if k in r})
            for r in rows if "eval/avg_acc" in r or "eval/avg_loss" in r]  # fmt: skip


def step_time(rows: list, skip: int = 1) -> dict:
    """SpecForge's own timing of its optimizer steps (the `perf/...` of its logged windows;
    the first window, with the warm-up and compilation, left out where there are more):
    seconds a step, of it waiting for data and computing, samples a second."""
    w = [r for r in rows if "perf/optimizer_step_time_s" in r]
    w = w[skip:] if len(w) > skip else w
    if not w:
        return {}
    mean = lambda k: round(sum(float(r.get(k, 0.0)) for r in w) / len(w), 4)  # noqa: E731
    return dict(windows=len(w), from_step=w[0]["step"], step_s=mean("perf/optimizer_step_time_s"),
                data_wait_s=mean("perf/data_wait_time_s"),
                compute_s=mean("perf/train_compute_time_s"),
                samples_per_s=mean("perf/global_samples_per_second"))  # fmt: skip


def last_step(run: Path):
    """The newest `{run_id}-step{N}` checkpoint SpecForge's CheckpointManager wrote."""
    steps = []
    for p in run.glob("*-step*"):
        m = re.search(r"-step(\d+)$", p.name)
        if m and (p / "training_state.pt").exists():
            steps.append((int(m.group(1)), p))
    return max(steps) if steps else (0, None)


def checkpoints(run: Path):
    """Each `{run_id}-step{N}` checkpoint SpecForge's CheckpointManager wrote: (N, folder)."""
    for p in run.glob("*-step*"):
        m = re.search(r"-step(\d+)$", p.name)
        if m and (p / "training_state.pt").exists():
            yield int(m.group(1)), p


def export(a) -> int:
    """SpecForge's own export of the trained drafter (its `specforge export`)."""
    ckpt = Path(a.ckpt)
    if not (ckpt / "training_state.pt").exists():
        step, ckpt = last_step(ckpt)
        if ckpt is None:
            raise SystemExit(f"{a.ckpt}: no SpecForge checkpoint")
    args = ["export", "--to", EXPORT_TO[a.kind], "--checkpoint", ckpt,
            "--draft-config", a.draft_config, "--output-dir", a.out]  # fmt: skip
    cmd = _py("-m", "bench.acceptance.specforge_cli", *args)  # the drafter's options
    print("specforge " + " ".join(map(str, args)), flush=True)
    rc = subprocess.call(cmd, env=package_env())
    if rc == 0:
        (Path(a.out) / "exported_from.json").write_text(
            json.dumps(dict(checkpoint=str(ckpt), tool="specforge export"), indent=1) + "\n"
        )
    return rc


def trained(out: Path) -> bool:
    """The training in `out` ended as planned: finished, or stopped by the budget with a
    checkpoint to serve (a budget that ended it before its first, as four trainers on the
    2-core CPU in 100 s, is trained again by a resumed run)."""
    f = out / "train.json"
    if not f.exists():
        return False
    r = json.loads(f.read_text())
    return r.get("rc") == 0 or bool(r.get("stopped_by_budget") and any(checkpoints(out / "run")))


def served_steps(steps: dict, ok: list) -> dict:
    """The step each trainer of a kind is served from: the newest checkpoint common to the
    trainers in `ok` (those that ended as planned), and for each other (failed) one its newest
    checkpoint at or before that (None: none). `steps`: name -> {step: checkpoint folder}."""
    common = set.intersection(*(set(steps[n]) for n in ok)) if ok else set()
    if not common:
        return {n: None for n in steps}
    step = max(common)
    return {n: step if n in ok else max((s for s in steps[n] if s <= step), default=None)
            for n in steps}  # fmt: skip
