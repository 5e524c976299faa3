"""`python -m hsdump vocab OUT --draft-vocab-size N`: the EAGLE-3 draft vocabulary mapping.

Reads OUT/token_freq.json (loss-masked token counts, see hsdump.store.stats), keeps the N most
frequent target tokens (ties: lower id first), in ascending target id order, and writes
OUT/vocab_mapping.safetensors with

    d2t  int64 [N]             offsets: target_id = i + d2t[i] for draft id i
    t2d  bool  [target_vocab]  True where the target token is in the draft vocabulary

the layout speculators and SpecForge load. It refuses N larger than the number of distinct
tokens seen, since the rest would be tokens the drafter never trained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

from hsdump.errors import Refusal
from hsdump.store.files import atomic_write, read_json_object
from hsdump.store.layout import MAPPING, VOCAB_LIMIT
from hsdump.store.stats import (
    committed_frequencies,
    read_token_freq,
    stale_committed_count,
    write_committed_token_freq,
)


def build_mapping(
    counts: Dict[int, int], draft_vocab_size: int, target_vocab_size: int
) -> Tuple[np.ndarray, np.ndarray]:
    """(d2t int64 [N], t2d bool [V]) for the N most frequent tokens of `counts`."""
    n, v = int(draft_vocab_size), int(target_vocab_size)
    seen = {t: c for t, c in counts.items() if c > 0}
    if n < 1:
        raise Refusal(f"--draft-vocab-size={n}: must be >= 1")
    if n > len(seen):
        raise Refusal(
            f"--draft-vocab-size={n} exceeds the {len(seen)} distinct tokens seen in "
            f"the loss; use N <= {len(seen)}, or tokenize more data"
        )
    if not 0 < v <= VOCAB_LIMIT:
        raise Refusal(
            f"a target vocabulary of {v} tokens is not a model's; pass the model's "
            "config.vocab_size as --target-vocab-size"
        )
    if n > v:
        raise Refusal(f"--draft-vocab-size={n} exceeds the target vocabulary ({v})")
    if seen and min(seen) < 0:
        raise Refusal(f"token id {min(seen)} is negative: token_freq.json is damaged")
    if seen and max(seen) >= v:
        raise Refusal(
            f"token id {max(seen)} is outside a target vocabulary of {v}; "
            "pass the model's config.vocab_size as --target-vocab-size"
        )
    top = sorted(seen, key=lambda t: (-seen[t], t))[:n]
    ids = np.array(sorted(top), dtype=np.int64)
    d2t = ids - np.arange(n, dtype=np.int64)
    t2d = np.zeros(v, dtype=bool)
    t2d[ids] = True
    return d2t, t2d


def _target_vocab_size(out: Path, meta: dict, given: Optional[int]) -> int:
    if given is not None:
        return given
    if meta.get("target_vocab_size"):
        if type(meta["target_vocab_size"]) is not int:
            raise Refusal(
                f"token_freq.json's target_vocab_size "
                f"({str(meta['target_vocab_size'])[:40]}) is not an int"
            )
        return meta["target_vocab_size"]
    v = _manifest_vocab_size(out)
    if v is None:
        raise Refusal(
            "cannot tell the target vocabulary size: pass --target-vocab-size V "
            "(the model's config.vocab_size)"
        )
    return v


def _manifest_vocab_size(out: Path) -> Optional[int]:
    """The model's vocab size as the dataset's manifest gives it or its config.json says."""
    from hsdump.store.commits import read_manifest

    try:
        m = read_manifest(out).get("model")
    except FileNotFoundError:
        return None
    m = m if isinstance(m, dict) else {}
    if type(m.get("vocab_size")) is int:
        return m["vocab_size"]
    for p in (m.get("resolved_path"), m.get("path")):
        cfg = Path(p) / "config.json" if isinstance(p, str) and p else None
        if cfg is not None and cfg.exists():  # the model's own folder, outside the dataset
            c = read_json_object(cfg, limit=64 << 20)
            c = c.get("text_config") if isinstance(c.get("text_config"), dict) else c
            if type(c.get("vocab_size")) is int:
                return c["vocab_size"]
    return None


def write_mapping(out_dir: str, d2t: np.ndarray, t2d: np.ndarray, meta: Dict[str, str]) -> Path:
    import torch
    from safetensors.torch import save

    out = Path(out_dir)
    path = out / MAPPING
    atomic_write(
        path, save({"d2t": torch.from_numpy(d2t), "t2d": torch.from_numpy(t2d)}, metadata=meta)
    )
    return path


def _frequencies(out: Path) -> Tuple[Dict[int, int], dict]:
    """token_freq.json's counts; for a regenerated dataset that its jobs have not counted in
    full yet (its last job counts it, hsdump.store.stats.count_if_complete), the committed samples
    counted now, and the file rewritten when the folder can be written."""
    if not stale_committed_count(str(out)):
        return read_token_freq(str(out))
    print(
        f"hsdump vocab: counting the committed samples of {out} (its token_freq.json is "
        "missing or counts fewer samples than the dataset holds)",
        file=sys.stderr,
    )
    try:
        write_committed_token_freq(str(out), target_vocab_size=_manifest_vocab_size(out))
    except PermissionError as e:
        print(f"hsdump vocab: {e}; using the counts without saving them", file=sys.stderr)
        return committed_frequencies(str(out))
    return read_token_freq(str(out))


def main(argv=None) -> int:
    from hsdump.command import prog

    ap = argparse.ArgumentParser(prog=prog("vocab"), description=__doc__.split("\n")[0])
    ap.add_argument("out", help="dataset directory holding token_freq.json")
    ap.add_argument(
        "--draft-vocab-size",
        "-n",
        type=int,
        required=True,
        help="number of tokens in the draft vocabulary",
    )
    ap.add_argument(
        "--target-vocab-size",
        type=int,
        default=None,
        help="target model's vocab size (default: from token_freq.json or the model)",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        counts, meta = _frequencies(out)
        v = _target_vocab_size(out, meta, args.target_vocab_size)
        d2t, t2d = build_mapping(counts, args.draft_vocab_size, v)
    except (Refusal, OSError) as e:  # only a refusal or the path named exits 2 (docs/errors.md)
        print(f"{prog('vocab')}: {e}", file=sys.stderr)
        return 2
    total = sum(counts.values())
    covered = sum(counts.get(int(t), 0) for t in np.nonzero(t2d)[0])
    try:
        path = write_mapping(
            str(out),
            d2t,
            t2d,
            {
                "format": "hsdump/vocab_mapping",
                "draft_vocab_size": str(len(d2t)),
                "target_vocab_size": str(v),
                "loss_tokens": str(total),
                "covered_tokens": str(covered),
                "convention": "target_id = draft_id + d2t[draft_id]",
            },
        )
    except OSError as e:
        print(f"{prog('vocab')}: cannot write {out / MAPPING}: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {path}: draft vocab {len(d2t)} of {len(counts)} distinct tokens seen "
        f"(target vocab {v}); covers {covered / max(total, 1):.2%} of {total} loss tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
