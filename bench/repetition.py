"""How a served drafter's accept length follows the repetition of what the target generates.

A greedy small target (SmolLM2-135M) falls into loops as its answer grows, and a drafter drafts a
loop easily. The trainer's evaluation runs over regenerated answers of up to 512 new tokens,
the serving over the first 256 of each held-out prompt's answer, so the two see different
shares of loops. This reads a results folder of `python3 -m bench.acceptance run-all` (its serve-*.json,
or .json.gz as recorded) and prints, for each drafter served, its prompts in quarters by their
output's repetition with each quarter's accept length, and, from the plain target's outputs,
the repetition in each window of positions along the answer.

A token counts as repeated when the n + 1 tokens ending at it (itself and the n before) already
occurred earlier in the same output.

    python bench/repetition.py --results bench/results/acceptance-eagle3-0517-5ep
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the repository first, and not bench/ (this script's folder), whose bench.py would shadow it
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

from bench.acceptance import read_json, served_name, step_acceptance  # noqa: E402


def repeated(ids: list, n: int) -> list:
    """Per token: whether the n + 1 tokens ending at it occurred earlier in `ids`."""
    seen, flags = set(), []
    for i in range(len(ids)):
        gram = tuple(ids[i - n : i + 1]) if i >= n else None
        flags.append(gram is not None and gram in seen)
        if gram is not None:
            seen.add(gram)
    return flags


def quarters(run: dict, n: int) -> list:
    """The run's prompts sorted by their output's repetition, in four quarters: each quarter's
    prompts, mean repetition, and accept length (its tokens over its verify steps); where the
    engine reported each request's verify steps by drafts accepted (`per_prompt_drafts`), also
    the quarter's share, per draft step, of the verify steps that reached the step and accepted
    it (`step_acceptance`, as `python3 -m bench.acceptance table` gives it for the whole run)."""
    rows = []
    drafts = run.get("per_prompt_drafts") or {}
    for k, (tokens, steps) in run["per_prompt"].items():
        out = run["outputs"].get(k) or []
        if steps and out:
            f = repeated(out, n)
            rows.append((sum(f) / len(f), tokens, steps, k))
    rows.sort()
    cut = [round(i * len(rows) / 4) for i in range(5)]
    res = []
    for q in range(4):
        part = rows[cut[q] : cut[q + 1]]
        if part:
            res.append(dict(prompts=len(part),
                            repetition=round(sum(r[0] for r in part) / len(part), 4),
                            accept_length=round(sum(r[1] for r in part) / sum(r[2] for r in part), 4)))  # fmt: skip
            hs = {r[3]: drafts[r[3]] for r in part if drafts.get(r[3])}
            if hs:
                res[-1]["step_acceptance"] = step_acceptance(hs)["step_acceptance"]
    return res


def windows(outputs: dict, n: int, width: int) -> list:
    """The share of repeated tokens at each window of answer positions, over the outputs long
    enough to reach it."""
    flags = [repeated(o, n) for o in outputs.values() if o]
    longest = max((len(f) for f in flags), default=0)
    res = []
    for start in range(0, longest, width):
        cells = [x for f in flags for x in f[start : start + width]]
        res.append(dict(positions=f"{start + 1}-{start + width}",
                        repetition=round(sum(cells) / len(cells), 4)))  # fmt: skip
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="a run-all results folder")
    p.add_argument("--n", type=int, default=6, help="tokens before the repeated one")
    p.add_argument("--window", type=int, default=64, help="answer positions per window")
    p.add_argument("--json", default=None, help="write the figures here too")
    a = p.parse_args(argv)
    res = Path(a.results)
    runs = {served_name(f): read_json(f)
            for f in (*res.glob("serve-*.json"), *res.glob("serve-*.json.gz"))}  # fmt: skip
    if not runs:
        raise SystemExit(f"{res}: no serve-*.json (a run-all results folder)")
    plain = runs.get("plain") or next(iter(runs.values()))
    out = dict(n=a.n, windows=windows(plain.get("outputs") or {}, a.n, a.window), drafters={})
    print(f"repetition along the answer ({'plain' if 'plain' in runs else 'first run'}'s outputs; "
          f"a token repeats when it and the {a.n} before occurred earlier):")  # fmt: skip
    print("  " + ", ".join(f"{w['positions']}: {w['repetition']:.3f}" for w in out["windows"]))
    for name, run in sorted(runs.items()):
        if not (run.get("engine") or {}).get("speculative_algorithm"):
            continue
        qs = quarters(run, a.n)
        out["drafters"][name] = qs
        print(
            f"{name}: prompts by repetition, in quarters (repetition -> accept length): "
            + ", ".join(f"{q['repetition']:.3f} -> {q['accept_length']:.3f}" for q in qs)
        )
        if any("step_acceptance" in q for q in qs):
            print(f"{name}: per draft step, served (of the verify steps that reached it), by "
                  "quarter: " + ", ".join("/".join(f"{x:.3f}" for x in q.get("step_acceptance", []))
                                          for q in qs))  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
