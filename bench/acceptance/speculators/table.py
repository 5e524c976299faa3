"""The speculators pipeline's table: one row per served variant, each drafter against the
default over the same prompts (`python3 -m bench.acceptance.speculators table`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..table import _prefix, paired

VARIANTS = (
    ("plain", "target alone (greedy reference)"),
    ("plain_eager", "target alone, no CUDA graphs (the baseline of eager drafters)"),
    ("default", "drafter on hsdump's data ([2,15,27] + pre-norm final, ChatML)"),
    ("layer_off", "control: data captured at [3,16,28], served as [2,15,27]"),
    ("template", "control: data tokenized with deepseek_v3.jinja"),
)


def collate(results: Path) -> dict:
    runs = {}
    for name, _ in VARIANTS:
        p = results / f"serve-{name}.json"
        if p.exists():
            runs[name] = json.loads(p.read_text())

    def graphs(r) -> bool:
        return not (r.get("engine") or {}).get("disable_cuda_graph", False)

    def plain_like(r):  # the plain run with the same CUDA-graph setting, else any plain run
        same = [p for n, p in runs.items() if n.startswith("plain") and graphs(p) == graphs(r)]
        return (same or [runs.get("plain", {})])[0]

    rows = []
    for name, what in VARIANTS:
        r = runs.get(name)
        if not r:
            continue
        ref = plain_like(r).get("outputs", {})
        outs = r.get("outputs", {})
        same = sum(1 for k, v in outs.items() if ref.get(k) == v)
        pre = [_prefix(v, ref[k]) / max(1, len(ref[k])) for k, v in outs.items() if k in ref]
        rows.append(
            dict(
                variant=name,
                what=what,
                accept_length=r["batched"]["accept_length"],
                tokens_per_s_batch1=r["batch1"]["tokens_per_s"],
                tokens_per_s_batched=r["batched"]["tokens_per_s"],
                accept_length_batch1=r["batch1"]["accept_length"],
                equal_to_plain=f"{same}/{len(outs)}",
                mean_common_prefix=round(sum(pre) / max(1, len(pre)), 3),
                completion_tokens=r["batched"]["completion_tokens"],
                engine_start_s=r.get("engine_start_s"),
                cuda_graphs=graphs(r),
                batch1_prompts=r["batch1"]["prompts"],
            )
        )
    # a speed-up only against a plain engine run the same way (CUDA graphs on or off)
    plains = [x for x in rows if x["variant"].startswith("plain")]
    for x in rows:
        plain = next((p for p in plains if p["cuda_graphs"] == x["cuda_graphs"]), None)
        for k in ("batch1", "batched"):
            base = plain[f"tokens_per_s_{k}"] if plain else None
            x[f"speedup_{k}"] = round(x[f"tokens_per_s_{k}"] / base, 3) if base else None
    return dict(rows=rows, against_default=paired(runs))


def print_table(rows) -> None:
    head = ("variant", "graphs", "accept len", "tok/s b=1", "x b=1", "tok/s batched",
            "x batched", "= plain")  # fmt: skip
    lines = [head]
    for x in rows:
        acc = x["accept_length"]
        lines.append(
            (
                x["variant"],
                "yes" if x["cuda_graphs"] else "no",
                "-" if acc is None else f"{acc:.3f}",
                f"{x['tokens_per_s_batch1']:.0f}",
                f"{x['speedup_batch1']:.2f}" if x["speedup_batch1"] else "-",
                f"{x['tokens_per_s_batched']:.0f}",
                f"{x['speedup_batched']:.2f}" if x["speedup_batched"] else "-",
                x["equal_to_plain"],
            )
        )
    w = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    for j, r in enumerate(lines):
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
        if j == 0:
            print("  ".join("-" * n for n in w))


def table(a) -> int:
    res = Path(a.results)
    out = collate(res)
    extra = res / "pipeline.json"
    if extra.exists():
        out["pipeline"] = json.loads(extra.read_text())
    print_table(out["rows"])
    for name, x in out["against_default"].items():
        print(f"default - {name}: {x['default_minus_this']:+.3f} accept length (95 % bootstrap "
              f"{x['ci95'][0]:+.3f}..{x['ci95'][1]:+.3f}, paired over {x['prompts']} prompts; "
              f"default higher on {x['prompts_default_higher']}, lower on "
              f"{x['prompts_default_lower']})")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0
