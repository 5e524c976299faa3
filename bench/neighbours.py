"""The neighbour verdict's figures on real weights: per model, three short chats, every decoder
layer k and neighbour k +- 1 inside the stack, transformers' own bf16 rows (what an engine's
rows are within: SGLang's error on a real 0.5B Qwen2-class model was below transformers' bf16
one) against its float32 states, on the tokens after the first (hsdump.check.neighbours):

    own    the rows' error at k
    nb     the rows' error against k +- 1 (what the old margin judged: nb > 5 x own + 0.01)
    apart  the model's own states at k and k +- 1 (what hsdump check judges: > 2 x own + 0.002)

    .venv/bin/python bench/neighbours.py smollm2:135m-instruct /path/to/gemma-3-270m \
        --out bench/results/neighbours-cpu.json

A model is a name hsdump builds (smollm2:135m-instruct, tiny:llama) or a checkpoint folder with
a chat template. tests/test_neighbour_rule.py judges the recorded file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench import environment
from hsdump import check as c
from hsdump.testing.close_layers import CHATS


def measure(model: str) -> dict:
    from transformers import AutoTokenizer

    from hsdump.corpus.chat import require_template
    from hsdump.corpus.masks import encode_conversation
    from hsdump.tiny import resolve_model_path

    path = resolve_model_path(model)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [encode_conversation(tok, require_template(tok), list(ch))[0] for ch in CHATS]
    t0 = time.time()
    ref = c.reference(path, prompts)
    pairs = []
    for p, ids in enumerate(prompts):
        f32, f16 = ref["fp32"][p].hidden_states, ref["bf16"][p].hidden_states
        last = len(f32) - 1  # after the final norm: another scale, not a decoder layer's input
        for k in range(1, last):
            nb = c.neighbours(f16[k], f32, k)
            for o in (k - 1, k + 1):
                if 0 < o < last:
                    e, n, d = nb.own, nb.near[o], nb.apart[o]
                    pairs.append(
                        {
                            "sample": p,
                            "tokens": len(ids),
                            "layer": k,
                            "neighbour": o,
                            "own": round(e, 6),
                            "nb": round(n, 6),
                            "apart": round(d, 6),
                            "best": nb.best,
                            "old_rule": n > 5.0 * e + 0.01,
                            "new_rule": c.neighbours_apart(d, e),
                        }
                    )
    return {
        "model": model,
        "lengths": [len(x) for x in prompts],
        "pairs": pairs,
        "seconds": round(time.time() - t0, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    a = ap.parse_args(argv)
    res = {
        "env": environment("cpu"),
        "rule": {"factor": c.NEIGHBOUR_FACTOR, "eps": c.NEIGHBOUR_EPS},
        "models": [measure(m) for m in a.models],
    }
    print(
        f"{'model':28s} {'tokens':>12s} {'own':>15s} {'nb / own':>9s} {'apart / own':>12s} "
        f"{'old rule':>9s} {'new rule':>9s} {'best = k':>9s}"
    )
    for r in res["models"]:
        ps = r["pairs"]
        print(
            f"{r['model'][-28:]:28s} {str(r['lengths']):>12s} "
            f"{min(p['own'] for p in ps):.4f}-{max(p['own'] for p in ps):.4f} "
            f"{min(p['nb'] / p['own'] for p in ps):>9.1f} "
            f"{min(p['apart'] / p['own'] for p in ps):>12.1f} "
            f"{sum(p['old_rule'] for p in ps):>4d}/{len(ps):<4d} "
            f"{sum(p['new_rule'] for p in ps):>4d}/{len(ps):<4d} "
            f"{sum(p['best'] == p['layer'] for p in ps):>4d}/{len(ps):<4d}"
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
