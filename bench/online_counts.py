"""Time hsdump.online.vocab.ordered_counts: the EAGLE-3 capture's token counts, written with its
plan before the engine starts, over synthetic samples (token ids as the tokenizer hands them:
Python lists).

    python3 bench/online_counts.py --samples 20000 --tokens 1000 --vocab 151936
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--vocab", type=int, default=151936)
    a = ap.parse_args(argv)
    from hsdump.online.vocab import ordered_counts

    rng = np.random.default_rng(0)
    mask = [0] * (a.tokens * 3 // 10) + [1] * (a.tokens - a.tokens * 3 // 10)
    rows = [(rng.integers(0, a.vocab, a.tokens).tolist(), mask) for _ in range(a.samples)]
    t = time.perf_counter()
    pairs = ordered_counts(rows)
    s = time.perf_counter() - t
    print(json.dumps(dict(samples=a.samples, tokens=a.tokens, vocab=a.vocab, distinct=len(pairs),
                          seconds=round(s, 3), us_per_sample=round(s / a.samples * 1e6, 1))))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
