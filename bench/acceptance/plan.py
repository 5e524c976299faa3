"""What a run-all run holds and takes: its disk at each kind's peak, what one session's GPU time
and disk hold (from a whole run), the backend and epochs a kind trains with (from the probe), a
profiler trace by kernel, and when the trainings stop
(`python3 -m bench.acceptance disk-plan|fit|plan|trace`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .capture import off_by_one


def covered(steps: list, prefixes) -> float:
    """Seconds of a run-all pipeline covered by its steps whose names start with `prefixes`
    (steps side by side counted once: the union of their intervals)."""
    iv = sorted((s["start_s"], s["start_s"] + s["wall_s"]) for s in steps
                if s["name"].startswith(tuple(prefixes)) and s.get("wall_s") is not None)  # fmt: skip
    total, end = 0.0, float("-inf")
    for a, b in iv:
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


TRAIN_SLACK_S, STOP_SLACK_S = 60, 80  # session_fit's --train-end-s and BG_DEADLINE_S


def session_fit(
    pipe: dict, budget_s: float, before_s: float, epochs, margin_s: float = 0.0
) -> dict:
    """What one session's GPU time and disk hold, from a whole run-all run of one kind
    (its pipeline.json): each captured sample's cost (the captures and exports, which scale
    with the samples), each training record's per epoch (the trainers side by side, their
    evaluations included), the rest fixed (the target, SpecForge's exports, `predict`, the
    serving, the gaps) plus `before_s` (the calls before the run, the import check). For each
    number of epochs E, the most samples N with fixed + c N + t E (N - eval) <= budget_s -
    margin_s, and the most the disk holds at the run's peak bytes a sample. Each row also says
    when, in seconds into run-all, its trainers would end (`trainers_end_s`: the fixed part
    before the first trainer starts, the captures, the training) and run-all would
    (`run_all_s`: plus the fixed part after the last trainer), and the two values to pass:
    `train_end_s` (--train-end-s: TRAIN_SLACK_S past the trainers' end, for a slower host) and
    `bg_deadline_s` (BG_DEADLINE_S: that stop, the fixed part after the trainers, and
    STOP_SLACK_S for the import check before run-all and the trainers' own stop, which came 24 s
    after --train-end-s on the H100 of 2026-12-06). A deadline set closer than that to
    --train-end-s cut that run's last served row."""
    facts, steps = pipe["facts"], pipe["steps"]
    if len(facts.get("training", {})) != 1:
        raise SystemExit("session_fit: a run of one kind only (run-all --kinds K)")
    ((kind, tr),) = facts["training"].items()
    samples = facts["datasets"]["default"]["samples"]
    records, ran = tr["train_records"], tr["epochs"]
    eval_n = samples - records
    capture = covered(steps, ("extract-", "export-", "reference-"))
    train = covered(steps, ("train-",))
    fixed = pipe["elapsed_s"] - capture - train + before_s
    trains = [s for s in steps if s["name"].startswith("train-") and s.get("wall_s") is not None]
    first = min(s["start_s"] for s in trains)
    pre = first - covered([s for s in steps if s["start_s"] < first], ("extract-", "export-",
                                                                       "reference-"))  # fmt: skip
    post = pipe["elapsed_s"] - max(s["start_s"] + s["wall_s"] for s in trains)
    c, t = capture / samples, train / (records * ran)
    disk = facts["disk"]
    per_byte = disk["peak_gb"] * 1e9 / samples
    fit = []
    for e in epochs:
        n = int((budget_s - margin_s - fixed + t * e * eval_n) / (c + t * e))
        end = pre + c * n + t * e * (n - eval_n)
        fit.append(dict(epochs=e, samples=n, records=n - eval_n,
                        steps_at_batch_8=(n - eval_n) * e // 8,
                        trainers_end_s=round(end), run_all_s=round(end + post),
                        train_end_s=round(end) + TRAIN_SLACK_S,
                        bg_deadline_s=round(end) + TRAIN_SLACK_S + round(post) + STOP_SLACK_S))  # fmt: skip
    return dict(kind=kind, samples=samples, records=records, epochs_run=ran,
                capture_s=round(capture, 1), train_s=round(train, 1), fixed_s=round(fixed, 1),
                capture_s_per_sample=round(c, 4), train_s_per_record_epoch=round(t, 4),
                budget_s=budget_s, before_s=before_s, margin_s=margin_s,
                fixed_before_trainers_s=round(pre, 1), fixed_after_trainers_s=round(post, 1),
                fit=fit,
                disk_bytes_per_sample=int(per_byte),
                disk_samples=int((disk["free_gb"] - disk["margin_gb"]) * 1e9 / per_byte))  # fmt: skip


# slots of H per record row in SpecForge's layout, per kind (EAGLE-3: 3 aux + the final state;
# DFlash: 5 layers; DSpark: 5 layers + the final state), and 16 bytes a row of ids and mask
EXPORT_SLOTS = {"eagle3": 4, "dflash": 5, "dspark": 6}
DISK_MARGIN = 8e9  # SpecForge's checkpoints (a drafter's weights and optimizer, every
# --save-interval steps, two to four trainers), the served folders, logs


def spent(capture: str, i: int, kinds) -> bool:
    """No step after kind `kinds[i]`'s export of `capture` reads that capture."""
    return capture == "template" or i == len(kinds) - 1


def disk_plan(index: dict, hidden: int, kinds, template: bool, ref_batch, slots: dict,
              speculators=False, overlap=False, controls=True) -> list:  # fmt: skip
    """What run-all holds on disk at each kind's peak, from the default capture's index:
    the captures (default, layer-off control, EAGLE-3's template control: the same samples, at
    `slots` tensors of H a row each: their layers and final states), each released once no
    later step reads it (`spent`), beside the kind's exports (bf16 rows, written one by one);
    with `ref_batch`, EAGLE-3's SpecForge capture of the same ids, whose records keep the rows
    of its padded batches (each batch of `ref_batch` consecutive samples padded to its
    longest); with `speculators`, EAGLE-3's `--to speculators` export too (the aux layers and
    the final state, stacked); with `overlap` (run-all --overlap), SpecForge's capture and the
    default's EAGLE-3 export are written while every capture is still held; without `controls`
    (run-all --no-controls) there is no layer-off capture and no control's export.
    [(kind, bytes at its peak, {what: bytes})]."""
    lengths = index["samples"]["length"]
    T = sum(lengths)
    row = lambda n: n * hidden * 2 + 16  # noqa: E731
    captures = ["default"] + (["layer_off"] if controls else [])
    held = {c: T * row(slots[c]) for c in captures}
    held["default"] = sum(index["shards"]["bytes"])  # measured
    if template:
        held["template"] = T * row(slots["template"])
    padded = ref_batch and sum(max(lengths[j : j + ref_batch]) * len(lengths[j : j + ref_batch])
                               for j in range(0, len(lengths), ref_batch))  # fmt: skip
    first = dict(held)  # before any export: every capture (the overlap's moment)
    out = []
    for i, kind in enumerate(kinds):
        eagle = kind == "eagle3"
        written, peak = {}, {}
        if eagle and ref_batch and overlap:
            ref = {"export default": T * row(EXPORT_SLOTS[kind]),
                   "SpecForge capture": padded * row(EXPORT_SLOTS[kind])}  # fmt: skip
            peak = {**first, **ref}
        if eagle and speculators:  # written first, from the default capture
            written["export speculators"] = T * row(EXPORT_SLOTS[kind])
        for c in captures + (["template"] if eagle and template else []):
            written[f"export {c}"] = T * row(EXPORT_SLOTS[kind])
            now = {**held, **written}
            peak = max(peak, now, key=lambda d: sum(d.values()))
            if spent(c, i, kinds):
                held.pop(c, None)
        if eagle and ref_batch:
            now = {**held, **written, "SpecForge capture": padded * row(EXPORT_SLOTS[kind])}
            peak = max(peak, now, key=lambda d: sum(d.values()))
        out.append((kind, sum(peak.values()), peak))
    return out


def check_disk(w: Path, index: dict, hidden: int, kinds, template: bool, ref_batch, slots: dict,
               free_gb=None, speculators=False, overlap=False, controls=True) -> dict:  # fmt: skip
    """Refuse a plan whose peak does not fit the disk under the work folder (the GPU host's
    is 64 GB), before the controls' captures and the trainings spend the host's time:
    naming the peak, the free space and what fits."""
    plan = disk_plan(index, hidden, kinds, template, ref_batch, slots, speculators, overlap,
                     controls)  # fmt: skip
    held = sum(index["shards"]["bytes"])  # the default capture is on disk already
    free = free_gb * 1e9 if free_gb is not None else shutil.disk_usage(w).free + held
    kind, peak, parts = max(plan, key=lambda x: x[1])
    facts = dict(free_gb=round(free / 1e9, 1), peak_gb=round(peak / 1e9, 1), peak_kind=kind,
                 margin_gb=DISK_MARGIN / 1e9,
                 peak_parts={k: round(v / 1e9, 1) for k, v in parts.items()})  # fmt: skip
    if peak + DISK_MARGIN > free:
        n = len(index["samples"]["length"])
        fit = int(n * (free - DISK_MARGIN) / peak) if free > DISK_MARGIN else 0
        gb = ", ".join(f"{k} {v}" for k, v in facts["peak_parts"].items())
        raise SystemExit(
            f"run-all: at {kind}'s step this run needs {peak / 1e9:.1f} GB on disk ({gb} GB) "
            f"plus {DISK_MARGIN / 1e9:.0f} GB for checkpoints, and {w} has {free / 1e9:.1f} GB "
            f"(counting the default capture's): run fewer kinds per run (--kinds), or "
            f"--samples {fit} or fewer (this capture has {n}), or --no-template-control"
        )
    return facts


def plan_capture(capture: Path, kinds, template: bool, ref_batch, speculators: bool, disk_gb,
                 w: Path, overlap=False, controls=True) -> dict:  # fmt: skip
    """check_disk for run-all's plan from its first capture (its index and manifest: lengths,
    bytes, layers, final states, the model's depth and width); the controls' capture as run-all
    makes it (the kinds' layers one off, post_norm where a kind trains on it)."""
    from hsdump.capture.kinds import dflash_default
    from hsdump.capture.layers import eagle3_default

    idx = json.loads((capture / "index.json").read_text())
    man = json.loads((capture / "manifest.json").read_text())
    L, hidden = man["model"]["num_hidden_layers"], man["model"]["hidden_size"]
    default = {
        "eagle3": eagle3_default(L),
        "dflash": dflash_default(L),
        "dspark": dflash_default(L),
    }
    ctl_final = 1 if {"eagle3", "dspark"} & set(kinds) else 0
    slots = dict(default=len(man["layers"]) + len(man.get("final") or []),
                 layer_off=len({x for k in kinds for x in off_by_one(default[k])}) + ctl_final,
                 template=len(default["eagle3"]) + 1)  # fmt: skip
    return check_disk(w, idx, hidden, kinds, template, ref_batch, slots, disk_gb, speculators,
                      overlap, controls)  # fmt: skip


def training_plan(a, kind: str, pr: dict, n_records: int, side_by_side: int = 2) -> dict:
    """The backend and epochs the kind trains with: --attention-backend, or the probe's faster
    (auto; sdpa without a probe); --epochs, or with --epochs-fit as many as fit in
    --train-budget-s (less a minute for the trainers' start and 10 % for evaluations and
    checkpoints) at the step time of the kind's `side_by_side` trainers sharing the GPU
    (drafter and control: 2; EAGLE-3 adds its template control, the drafter on SpecForge's
    capture and speculators' trainer): each needs the GPU for its busy time a step (the
    probe's profile), so a shared step takes the longer of one step alone and N times that busy
    time (N times the step alone without a profile). On the H200 (2026-12-04, SmolLM2, batch 8,
    flex_attention) DFlash's step alone took 0.393 s with the GPU busy 0.131 s of it and the
    pair ran at 0.327 s a step each (they fill each other's idle time); DSpark's took 0.654 s
    alone, 0.349 s busy, and 0.815 s each in the pair, above this estimate (0.698 s): an
    estimate, so the budget still stops the trainers. At least --epochs."""
    backend = a.attention_backend
    if backend == "auto":
        backend = pr.get("faster") or "sdpa"
    epochs, why = a.epochs, "--epochs"
    got = (pr.get("backends") or {}).get(backend) or {}
    step_s = got.get("step_time", {}).get("step_s")
    prof = got.get("profile") or {}
    busy_s = prof["gpu_busy_ms"] / 4000 if prof.get("gpu_busy_ms") else None  # 4 steps profiled
    n = max(1, side_by_side)
    pair_s = max(step_s, n * busy_s) if step_s and busy_s else n * step_s if step_s else None
    n_train = max(1, n_records - a.eval_samples)
    per_epoch = max(1, n_train // a.batch_size)
    if a.epochs_fit and pair_s:
        fit = int(0.9 * (a.train_budget_s - 60) / (per_epoch * pair_s))
        epochs, why = (
            max(a.epochs, fit),
            (f"--epochs-fit: {fit} fit at {pair_s:.3f} s a step, {n} trainers side by side"),
        )
    return dict(attention_backend=backend, epochs=int(epochs), epochs_from=why,
                steps_per_epoch=per_epoch, train_records=n_train, probe_step_s=step_s,
                probe_gpu_busy_s=busy_s, pair_step_s=pair_s, side_by_side=n,
                planned_steps=per_epoch * int(epochs))  # fmt: skip


def trace_summary(path: Path, top: int = 12) -> dict:
    """A PyTorch profiler trace (chrome JSON, gzipped or not) by GPU kernel: the window's wall
    time, the GPU's busy time in it, the kernels taking most of it; and the CPU ops taking
    most (inclusive) time."""
    import gzip

    raw = gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)
    with raw as f:
        ev = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    kern = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    span = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) if ev else 0

    def by_name(es):
        d = {}
        for e in es:
            k = e["name"][:120]
            t, c = d.get(k, (0.0, 0))
            d[k] = (t + float(e["dur"]), c + 1)
        return [dict(name=k, ms=round(t / 1000, 2), calls=c)
                for k, (t, c) in sorted(d.items(), key=lambda x: -x[1][0])[:top]]  # fmt: skip

    busy = sum(float(e["dur"]) for e in kern)
    cpu = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]  # not the stacks
    return dict(window_ms=round(span / 1000, 1), gpu_busy_ms=round(busy / 1000, 1),
                gpu_busy_share=round(busy / span, 3) if span else None,
                kernels=by_name(kern), cpu_ops=by_name(cpu))  # fmt: skip


def trainers_stop(a):
    """Seconds into run-all by which the trainings stop: --train-end-s, or --deadline-s less
    --after-train-s (what follows them), whichever is sooner; None without either. A deadline
    that leaves nothing to train is refused before any work, naming both fixes."""
    ends = [a.train_end_s] if a.train_end_s is not None else []
    if a.deadline_s is not None:
        left = a.deadline_s - a.after_train_s
        if left <= 0:
            raise SystemExit(
                f"run-all: --deadline-s {a.deadline_s:.0f} leaves nothing to train once "
                f"--after-train-s {a.after_train_s:.0f} is kept for the exports and the serving: "
                "give the run a later deadline (run-0523.sh: BG_DEADLINE_S) or keep less after "
                "the trainings"
            )
        ends.append(left)
    return min(ends) if ends else None


def train_end(now: float, budget_s: float, started: float, end_s=None) -> float:
    """When the trainings stop: `budget_s` after they start, or `end_s` after run-all started
    (--train-end-s), whichever comes first."""
    end = now + budget_s
    return end if end_s is None else min(end, started + end_s)
