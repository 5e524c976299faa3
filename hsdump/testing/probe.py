"""The family probe's verdict (bench/families_probe.py): a family's captured rows against
transformers' hidden_states, by hsdump.check's rules (rule 1 per sample; rule 2, the MoE rule,
reported beside it), with the index the rows match best. tests/test_families_probe.py checks it.

Status: ok; wrong-layer (the rows equal another index: the capture is shifted); wrong (the rows
match no index within tolerance, or have another shape than transformers'); too-close (the rows
pass rule 1 but fail `hsdump check`'s neighbour verdict, hsdump.check.neighbours: closest to
another index, or the model's own states at k and k +- 1 not apart by twice the rows' error).
"""

from __future__ import annotations

from hsdump.check import (
    MATCH_EPS,
    MATCH_FACTOR,
    PER_SAMPLE_EPS,
    PER_SAMPLE_FACTOR,
    moe_layer_failures,
    neighbours,
    rel_err,
)


def layers_for(num_layers: int):
    return [1, num_layers // 2, num_layers - 1]


def compare(records, layers, ref32, ref16) -> dict:
    per = {
        str(k): {"err": [], "bf16": [], "prev": [], "next": [], "best": [], "neighbour": []}
        for k in layers
    }
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
            # hsdump check's neighbour verdict (on the tokens after the first)
            d["neighbour"] += neighbours(h, r32, k).failures(f"sample {sid} layer {k}")
            if not h.float().isfinite().all():
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
        if d["neighbour"] and status == "ok":
            status = "too-close"
            detail += d["neighbour"][:2]
    if problems:
        status = "wrong"
    # hsdump.check's MoE rule (rule 2): per layer, mean err <= 2 x mean
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
                "neighbour_ok": not d["neighbour"],
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
