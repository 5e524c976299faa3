"""The results' tables: one row per served engine with its prediction, the drafters paired
with their controls over the same prompts (paired bootstrap), where outputs leave plain greedy,
and the trainers' curves (`python3 -m bench.acceptance table|curves`)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from .drafter import KINDS, SERVED_STEPS
from .specforge import eval_curve, trainer_metrics


def _prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def paired(runs: dict, draws: int = 2000, seed: int = 0) -> dict:
    """Each other drafter's accept length against the default's over the same held-out
    prompts: the difference, a 95 % bootstrap interval (prompts resampled, paired), and
    how many prompts the default accepted more (fewer) tokens per step on."""
    import random

    base = (runs.get("default") or {}).get("per_prompt")
    out = {}
    if not base:
        return out
    for name, r in runs.items():
        pp = r.get("per_prompt")
        if name.startswith("plain") or name == "default" or not pp:
            continue
        keys = sorted(k for k in base if k in pp and base[k][1] and pp[k][1])

        def diff(ks):
            a = sum(base[k][0] for k in ks) / sum(base[k][1] for k in ks)
            return a - sum(pp[k][0] for k in ks) / sum(pp[k][1] for k in ks)

        rng = random.Random(seed)
        boot = sorted(diff([rng.choice(keys) for _ in keys]) for _ in range(draws))
        per = [base[k][0] / base[k][1] - pp[k][0] / pp[k][1] for k in keys]
        out[name] = dict(
            prompts=len(keys),
            default_minus_this=round(diff(keys), 4),
            ci95=[round(boot[int(0.025 * draws)], 4), round(boot[int(0.975 * draws)], 4)],
            prompts_default_higher=sum(x > 0 for x in per),
            prompts_default_lower=sum(x < 0 for x in per),
        )
    return out


def _first_differences(outs: dict, ref: dict, mg: dict) -> list:
    """Per prompt whose output differs from `ref`'s: the first differing position, the
    reference run's own top-1 minus top-2 logprob there, whether `outs` took its runner-up."""
    firsts = []
    for k, v in outs.items():
        if k not in ref or ref[k] == v:
            continue
        i = _prefix(v, ref[k])
        if i >= min(len(v), len(ref[k])):  # one stopped earlier: no differing token
            firsts.append(dict(prompt=k, position=i, margin=None, runner_up=None))
            continue
        m = (mg.get(k) or [])[i] if i < len(mg.get(k) or []) else [None, None]
        firsts.append(dict(prompt=k, position=i, margin=m[0],
                           runner_up=None if m[1] is None else int(v[i]) == m[1]))  # fmt: skip
    return firsts


def _summary(firsts: list, near: float) -> dict:
    ms = sorted(f["margin"] for f in firsts if f["margin"] is not None)
    pos = sorted(f["position"] for f in firsts)
    return dict(diverged=len(firsts), with_margin=len(ms),
                median_margin=ms[len(ms) // 2] if ms else None,
                max_margin=ms[-1] if ms else None,
                near_ties=sum(1 for x in ms if x <= near), near=near,
                took_runner_up=sum(1 for f in firsts if f["runner_up"]),
                median_first_position=pos[len(pos) // 2] if pos else None)  # fmt: skip


def divergence(run: dict, plain: dict, near: float = 0.25) -> dict:
    """Where a run's greedy outputs leave the plain target's: per prompt whose output differs,
    the first position that differs, the plain target's own top-1 minus top-2 logprob there
    (`plain_margins`, from `serve --margins`) and whether the run took the plain target's
    second choice. The logits are bf16: at the magnitudes of an LM head's top logits (16-64)
    neighbouring values lie 0.125-0.25 apart, so a margin <= `near` is a tie within one or two
    steps of bf16, which any change of kernel or batch shape can flip (at a margin of 0 the
    top-2 order among equal values is arbitrary, so `took_runner_up` undercounts ties). A
    run whose every first difference is such a tie diverges by numerics; a wide margin points
    to a fault. The same for the run's batch-1 outputs against the plain target's batched ones
    (`batch1`): the plain engine's own batch-1 outputs measure the numerics of batch shape
    alone, with no drafter."""
    ref, outs = plain.get("outputs") or {}, run.get("outputs") or {}
    mg = plain.get("plain_margins") or {}
    firsts = _first_differences(outs, ref, mg)
    out = dict(prompts=len(outs), equal=sum(1 for k, v in outs.items() if ref.get(k) == v),
               **_summary(firsts, near), first=firsts[:64])  # fmt: skip
    b1 = run.get("outputs_batch1") or {}
    if b1:  # the same engine at batch 1 against its own batched outputs, and against plain's
        same = sum(1 for k, v in b1.items() if outs.get(k) == v)
        out["batch1_equal_to_own_batched"] = f"{same}/{len(b1)}"
        f1 = _first_differences(b1, ref, mg)
        out["batch1"] = dict(prompts=len(b1), equal=len(b1) - len(f1), **_summary(f1, near),
                             first=f1[:16])  # fmt: skip
    return out


def capped(r: dict) -> dict:
    """DSpark in cap-accept mode (a served run's `per_prompt_cap`): SGLang's per-request accept
    length without the confidence head's cap and scheduled verify length, each per verify step,
    summed over the prompts weighted by their verify steps (as SGLang's own totals are)."""
    out = dict(block_accept_length=None, cap_length=None)
    cap, per = r.get("per_prompt_cap") or {}, r.get("per_prompt") or {}
    for i, name in enumerate(("block_accept_length", "cap_length")):
        got = [(x[i], per[k][1]) for k, x in cap.items() if k in per and x[i] is not None]
        if v_sum := sum(v for _, v in got):
            out[name] = round(sum(x * v for x, v in got) / v_sum, 4)
    return out


KV_POOL_RACE = "leave no GPU memory for the KV cache"


def kv_pool_race(log: Path) -> bool:
    """Whether a serving engine ended because SGLang found no memory for its KV pool: it
    measures the free memory before and after loading its weights, and the engines starting
    beside it allocate theirs in between (the H200, SGLang 0.5.17, 2026-12-04: the fifth of
    five engines at --mem-fraction 0.16 each, its "minimum viable" put at 0.1634). Alone it
    starts."""
    return log.exists() and KV_POOL_RACE in log.read_text(errors="replace")


def served_name(p: Path) -> str:
    """serve-NAME.json or serve-NAME.json.gz (a recorded run's, compressed to keep the tree
    small): NAME."""
    return p.name[len("serve-") :].removesuffix(".gz").removesuffix(".json")


def read_json(p: Path):
    return json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_text())


def step_acceptance(per_prompt_drafts: dict) -> dict:
    """The served run's verify steps by drafts accepted (SGLang's per-request histograms,
    summed over the prompts) and, per draft step k, the share of the steps that reached it
    (accepted the k - 1 drafts before) that accepted it too: what the trainer's per-position
    accuracy predicts, step by step, if the steps are independent."""
    n = max((len(h) for h in per_prompt_drafts.values()), default=0)
    hist = [sum(h[k] for h in per_prompt_drafts.values() if k < len(h)) for k in range(n)]
    reached = [sum(hist[k:]) for k in range(n)]
    rates = [round(reached[k] / reached[k - 1], 4) for k in range(1, n) if reached[k - 1]]
    mean = sum(k * x for k, x in enumerate(hist)) / reached[0] if n and reached[0] else None
    return dict(histogram=hist, step_acceptance=rates,
                accept_length=None if mean is None else round(1 + mean, 4))  # fmt: skip


def collate(res: Path) -> dict:
    """One row per served engine; the plain run (same CUDA-graph setting) is the reference
    of `equal_to_plain` and of the speed-ups; per kind, drafter minus control per prompt."""
    found = (*res.glob("serve-*.json"), *res.glob("serve-*.json.gz"))
    runs = {served_name(p): read_json(p) for p in found}
    graphs = lambda r: not (r.get("engine") or {}).get("disable_cuda_graph", False)  # noqa: E731
    plains = {graphs(r): r for n, r in runs.items() if n.startswith("plain")}
    rows = []
    for name, r in sorted(runs.items(), key=lambda kv: (not kv[0].startswith("plain"), kv[0])):
        # outputs against the plain run with the same CUDA-graph setting, else any plain run;
        # speed-ups only against the same setting (an eager drafter beside a graphed target
        # measures the graphs, not the drafter)
        same_plain = plains.get(graphs(r))
        ref = (same_plain or plains.get(True) or plains.get(False) or {}).get("outputs", {})
        outs = r.get("outputs", {})
        same = sum(1 for k, v in outs.items() if ref.get(k) == v)
        pre = [_prefix(v, ref[k]) / max(1, len(ref[k])) for k, v in outs.items() if k in ref]
        kind = None if name.startswith("plain") else name.split("-")[0]
        tr = res / f"train-{name}.json"
        pred = json.loads(tr.read_text()) if tr.exists() else {}
        drafts = step_acceptance(r["per_prompt_drafts"]) if r.get("per_prompt_drafts") else None
        step_acc = (pred.get("eval") or {}).get("eval/per_position_acc") or []
        row = dict(
            variant=name,
            kind=kind,
            algorithm=(r.get("engine") or {}).get("speculative_algorithm"),
            accept_length=r["batched"]["accept_length"],
            accept_length_batch1=r["batch1"]["accept_length"],
            ragged_verify_mode=r.get("ragged_verify_mode", "static"),
            **capped(r),
            tokens_per_s_batch1=r["batch1"]["tokens_per_s"],
            tokens_per_s_batched=r["batched"]["tokens_per_s"],
            # None without a plain run to compare with (its engine failed): not 0 equal
            equal_to_plain=f"{same}/{len(outs)}" if ref else None,
            mean_common_prefix=round(sum(pre) / max(1, len(pre)), 3) if ref else None,
            predicted_accept_length=pred.get("predicted"),
            predicted_from=pred.get("source"),
            trained_steps=pred.get("steps"),
            served_step=pred.get("served_step"),
            cuda_graphs=graphs(r),
            engine_start_s=r.get("engine_start_s"),
            # per draft step: served (conditional on the steps before) and the trainer's
            # held-out per-position accuracy at the served step (EAGLE-3's)
            served_drafts=drafts,
            trainer_step_accuracy=step_acc[:SERVED_STEPS] if kind == "eagle3" else None,
            # where its outputs leave the plain target's, and how near a tie that was there
            divergence=divergence(r, same_plain or plains.get(True) or plains.get(False))
            if ref
            else None,
        )
        for k in ("batch1", "batched"):
            base = ((same_plain or {}).get(k) or {}).get("tokens_per_s")
            row[f"speedup_{k}"] = round(row[f"tokens_per_s_{k}"] / base, 3) if base else None
        rows.append(row)
    pairs, own_layers = {}, {}
    for k in KINDS:
        d, c, t = (runs.get(f"{k}-{v}") for v in ("default", "layer_off", "template"))
        if d and c:
            pairs[k] = paired({"default": d, "layer_off": c})["layer_off"]
        o = runs.get(f"{k}-layer_off_own")  # the control on the layers it trained on
        if d and o:
            pairs[f"{k}-layer_off_own"] = paired({"default": d, "own": o})["own"]
        if c and o:  # what reading the drafter's layers (one off its own) cost the control
            own_layers[k] = paired({"default": o, "off": c})["off"]
        if d and t:  # EAGLE-3's wrong-template control
            pairs[f"{k}-template"] = paired({"default": d, "template": t})["template"]
        r = runs.get(f"{k}-specforge")  # the same ids captured by SpecForge's own capture
        if d and r:
            pairs[f"{k}-specforge"] = paired({"default": d, "specforge": r})["specforge"]
        r = runs.get(f"{k}-speculators")  # hsdump's data, trained by speculators instead
        if d and r:
            pairs[f"{k}-speculators"] = paired({"default": d, "speculators": r})["speculators"]
    served = {r["variant"]: r["served_step"] for r in rows}
    for k, x in pairs.items():  # each pair's two served steps: a control whose trainer failed
        # is served at the step it reached, not the drafter's
        kind, _, other = k.partition("-")
        x["served_steps"] = [served.get(f"{kind}-default"),
                             served.get(f"{kind}-{other or 'layer_off'}")]  # fmt: skip
        both = all(isinstance(v, int) for v in x["served_steps"])  # speculators': epochs
        x["same_step"] = (x["served_steps"][0] == x["served_steps"][1]) if both else None
    return dict(rows=rows, drafter_minus_control=pairs, control_own_minus_off=own_layers)


def table(a) -> int:
    res = Path(a.results)
    out = collate(res)
    for f in ("pipeline.json",):
        if (res / f).exists():
            out["pipeline"] = json.loads((res / f).read_text())
    head = ("variant", "accept", "predicted", "tok/s b=1", "x b=1", "tok/s batched", "x batched",
            "= plain")  # fmt: skip
    lines = [head]
    for x in out["rows"]:
        f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append((x["variant"], f3(x["accept_length"]), f3(x["predicted_accept_length"]),
                      f"{x['tokens_per_s_batch1']:.0f}", f3(x["speedup_batch1"]),
                      f"{x['tokens_per_s_batched']:.0f}", f3(x["speedup_batched"]),
                      x["equal_to_plain"] or "-"))  # fmt: skip
    w = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    for r in lines:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
    for x in out["rows"]:
        if x.get("block_accept_length") is not None:
            print(f"{x['variant']}: SGLANG_RAGGED_VERIFY_MODE={x['ragged_verify_mode']}: accept "
                  f"{x['accept_length']:.3f} capped by its confidence head, "
                  f"{x['block_accept_length']:.3f} without the cap")  # fmt: skip
    for x in out["rows"]:
        sd, acc_k = x.get("served_drafts"), x.get("trainer_step_accuracy")
        if sd and sd["step_acceptance"]:
            f = lambda v: "/".join("-" if y is None else f"{y:.3f}" for y in v)  # noqa: E731
            also = f"; the trainer's held-out accuracy {f(acc_k)}" if acc_k else ""
            print(f"{x['variant']}: per draft step, served {f(sd['step_acceptance'])} (of the "
                  f"verify steps that reached it){also}")  # fmt: skip
    for x in out["rows"]:
        d = x.get("divergence") or {}
        for what, e in (("outputs", d), ("batch-1 outputs", d.get("batch1") or {})):
            if e.get("diverged"):
                print(f"{x['variant']}: {e['diverged']} of {e['prompts']} {what} leave plain "
                      f"greedy (batched); at the first differing token the plain target's top-1 "
                      f"minus top-2 logprob is <= {e['near']} on {e['near_ties']} of "
                      f"{e['with_margin']} (median {e['median_margin']}, largest "
                      f"{e['max_margin']}); the run took the runner-up on {e['took_runner_up']}")  # fmt: skip
    for k, x in out["drafter_minus_control"].items():
        steps = "" if x.get("same_step") is not False else (
            f"; NOT the same step: drafter at {x['served_steps'][0]}, control at "
            f"{x['served_steps'][1]}")  # fmt: skip
        print(f"{k}: drafter - control {x['default_minus_this']:+.3f} accept length (95 % "
              f"bootstrap {x['ci95'][0]:+.3f}..{x['ci95'][1]:+.3f}, {x['prompts']} prompts)"
              f"{steps}")  # fmt: skip
    for k, x in out["control_own_minus_off"].items():
        print(f"{k}: the control on its own layers - on the drafter's {x['default_minus_this']:+.3f} "
              f"accept length (95 % bootstrap {x['ci95'][0]:+.3f}..{x['ci95'][1]:+.3f}, "
              f"{x['prompts']} prompts)")  # fmt: skip
    dest = Path(a.json) if getattr(a, "json", None) else res / "acceptance-kinds.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    os.replace(tmp, dest)
    return 0


def epoch_curves(rows: list, steps_per_epoch: int) -> list:
    """Per epoch, the mean of SpecForge's logged training windows (token accuracy, and
    DSpark's `tau_probabilistic`: records the drafter has seen before from the second epoch
    on) beside the held-out evaluation at the epoch's end: where the two part, the drafter is
    learning its records rather than the task."""
    train = [r for r in rows if "acc" in r]
    evals = {r["step"]: r for r in rows if "eval/avg_acc" in r}
    last = max([r["step"] for r in rows] or [0])
    out = []
    for e in range(1, -(-last // steps_per_epoch) + 1):
        lo, hi = (e - 1) * steps_per_epoch, e * steps_per_epoch
        w = [r for r in train if lo < r["step"] <= hi]
        ev = [s for s in evals if lo < s <= hi]

        def mean(k, w=w):
            return round(sum(r[k] for r in w) / len(w), 4) if w and all(k in r for r in w) else None

        row = dict(epoch=e, windows=len(w), train_acc=mean("acc"),
                   train_tau=mean("tau_probabilistic"))  # fmt: skip
        if ev:
            r = evals[max(ev)]
            row.update(eval_step=r["step"], eval_acc=round(r["eval/avg_acc"], 4),
                       eval_loss=round(r["eval/avg_loss"], 4))  # fmt: skip
        out.append(row)
    return out


def curves(a) -> int:
    """Every trainer's curves in a run-all results folder (its `sf-train-*.log`): the
    evaluations as logged and the epochs' training windows beside them (`epoch_curves`), an
    epoch's steps from --steps-per-epoch or the run's pipeline.json."""
    res = Path(a.results)
    plan = {}
    pj = res / "pipeline.json"
    if pj.exists():
        plan = json.loads(pj.read_text()).get("facts", {}).get("training", {})
    got = {}
    for log in sorted(res.glob("sf-train-*.log")):
        name = log.stem[len("sf-train-") :]
        spe = a.steps_per_epoch or plan.get(name.split("-")[0], {}).get("steps_per_epoch")
        if not spe:
            raise SystemExit(f"{log}: no steps per epoch: pass --steps-per-epoch")
        rows = trainer_metrics(log)
        got[name] = dict(steps_per_epoch=spe, eval_curve=eval_curve(rows),
                         epochs=epoch_curves(rows, spe))  # fmt: skip
        for r in got[name]["epochs"]:
            print(name, json.dumps(r))
    if a.json:
        Path(a.json).write_text(json.dumps(got, indent=1) + "\n")
    return 0 if got else 1
