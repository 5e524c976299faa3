"""Time hsdump.online.vocab.ordered_counts: the EAGLE-3 capture's token counts, written with its
plan, over synthetic samples fed as the capture feeds them: rows of the tokenized dataset's
Arrow columns (hsdump.corpus.tokenization.RowsView, in chunks of --chunk-rows, as datasets
writes them), taken one by one in SpecForge's file order (not the rows' order).

    python3 bench/online_counts.py --samples 20000 --tokens 1000 --vocab 151936
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def rows(n: int, tokens: int, vocab: int, chunk_rows: int):
    """(input_ids, loss_mask) RowsViews over n rows of `tokens` ids (the last 70 % in the loss)."""
    import pyarrow as pa

    from hsdump.corpus.tokenization import RowsView

    rng = np.random.default_rng(0)
    mask = np.r_[np.zeros(tokens * 3 // 10), np.ones(tokens - tokens * 3 // 10)].astype(np.int8)
    ids_chunks, mask_chunks = [], []
    for start in range(0, n, chunk_rows):
        k = min(chunk_rows, n - start)
        offsets = pa.array(np.arange(k + 1, dtype=np.int32) * tokens)
        ids_chunks.append(pa.ListArray.from_arrays(offsets, rng.integers(0, vocab, k * tokens)))
        mask_chunks.append(pa.ListArray.from_arrays(offsets, np.tile(mask, k)))
    pos = list(range(n))
    return (RowsView(pa.chunked_array(ids_chunks), pos),
            RowsView(pa.chunked_array(mask_chunks), pos))  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunk-rows", type=int, default=1000)
    a = ap.parse_args(argv)
    from hsdump.online.producer import file_order
    from hsdump.online.vocab import ordered_counts

    ids, mask = rows(a.samples, a.tokens, a.vocab, a.chunk_rows)
    order = file_order(list(range(a.samples)))
    t = time.perf_counter()
    pairs = ordered_counts((ids[i], mask[i]) for i in order)
    s = time.perf_counter() - t
    print(json.dumps(dict(samples=a.samples, tokens=a.tokens, vocab=a.vocab, distinct=len(pairs),
                          seconds=round(s, 3), us_per_sample=round(s / a.samples * 1e6, 1))))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
