"""Token frequencies over loss-masked tokens, written beside the dataset (no GPU pass).

`write_token_freq(tokenized, out_dir)` counts, over every kept sample, the tokens of
`input_ids` whose `loss_mask` is 1 and writes OUT/token_freq.json:

    {"format": "hsdump/token_freq", "version": 1,
     "counted": "input_ids where loss_mask == 1",
     "samples": 9876, "loss_tokens": 4567890, "distinct": 31234,
     "target_vocab_size": 128256,            # null when unknown
     "counts": {"13": 120345, "279": 99871, ...}}   # token id (as a string) -> count

The same dict id -> count that speculators keeps in token_freq.pt, as plain JSON (no
pickle). `python -m hsdump vocab OUT --draft-vocab-size N` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from hsdump.errors import MissingInput, Refusal
from hsdump.store.files import atomic_write, read_json_object
from hsdump.store.layout import TOKEN_FREQ, TOKEN_FREQ_FORMAT, TOKEN_FREQ_LIMIT, TOKEN_FREQ_VERSION


def _add_counts(counts: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """counts (dense, by token id) plus the loss-masked ids; may return a longer array."""
    sel = ids[mask.astype(bool)].astype(np.int64)
    if sel.size == 0:
        return counts
    if sel.min() < 0:
        raise ValueError("negative token id in input_ids")
    c = np.bincount(sel)
    if c.size > counts.size:
        c[: counts.size] += counts
        return c
    counts[: c.size] += c
    return counts


def token_counts(tokenized) -> np.ndarray:
    """Dense int64 counts indexed by token id, over loss-masked tokens of kept samples."""
    counts = np.zeros(0, dtype=np.int64)

    def add(ids: np.ndarray, mask: np.ndarray) -> None:
        nonlocal counts
        counts = _add_counts(counts, ids, mask)

    table = getattr(tokenized, "table", None)
    if table is not None:  # Arrow-backed: skipped rows hold empty lists, so count every row
        pa_table = table.data.table if hasattr(table.data, "table") else table.data
        for batch in pa_table.select(["input_ids", "loss_mask"]).to_batches(max_chunksize=8192):
            add(
                batch.column(0).flatten().to_numpy(zero_copy_only=False),
                batch.column(1).flatten().to_numpy(zero_copy_only=False),
            )
    else:
        for ids, mask in zip(tokenized.input_ids, tokenized.loss_mask):
            if len(ids) != len(mask):
                raise ValueError("input_ids and loss_mask differ in length")
            add(np.asarray(ids, dtype=np.int64), np.asarray(mask))
    return counts


def token_frequencies(tokenized) -> Dict[int, int]:
    """{token id: count} over loss-masked tokens, ids with a zero count left out."""
    return _as_dict(token_counts(tokenized))


def _as_dict(counts: np.ndarray) -> Dict[int, int]:
    return {int(i): int(counts[i]) for i in np.nonzero(counts)[0]}


def write_token_freq(tokenized, out_dir: str, target_vocab_size: Optional[int] = None) -> Path:
    """Count loss-masked tokens of `tokenized` and write OUT/token_freq.json atomically.

    `target_vocab_size` (the model's config.vocab_size) is recorded so `hsdump vocab` can size
    t2d; token ids must be below it. Returns the file's path.
    """
    return _write(
        token_counts(tokenized),
        len(tokenized.ids),
        out_dir,
        target_vocab_size,
        "input_ids where loss_mask == 1",
    )


COMMITTED = "input_ids where loss_mask == 1, of the committed samples"


def uncommitted(out_dir: str, ids: Iterable[int]) -> int:
    """How many of `ids` (the whole dataset's sample ids, every job's) the dataset neither
    holds nor records as skipped, as its index and all its jobs' logs say now."""
    from hsdump.store.commits import load

    c = load(Path(out_dir))
    skipped = c.skipped
    held = c.sample_ids()
    return sum(1 for i in ids if i not in held and i not in skipped)


def count_if_complete(
    out_dir: str, ids: Iterable[int], target_vocab_size: Optional[int] = None
) -> Tuple[Optional[Path], int]:
    """A regenerated dataset's token_freq.json, written only by a job that finds the dataset
    complete (`ids` all committed or skipped): (its path, 0), else (None, samples left).

    Counting re-reads every committed sample's ids and mask (45-57 us a sample on the dev VM,
    bench/token_freq_scale.py), so with J jobs each counting at its end a 1M-sample dataset
    would be read J times; this way it is read once, by the last job to end (a job commits
    before it checks, so of jobs ending together the last to check sees all). Until then
    `hsdump vocab` counts what is committed itself (`stale_committed_count`)."""
    left = uncommitted(out_dir, ids)
    if left:
        return None, left
    return write_committed_token_freq(out_dir, target_vocab_size), 0


def stale_committed_count(out_dir: str) -> bool:
    """True for a regenerated dataset (manifest `regenerate` set) whose token_freq.json is
    missing or counts fewer samples than the dataset holds: `hsdump vocab` recounts it."""
    from hsdump.store.commits import load, read_manifest

    try:
        if not read_manifest(Path(out_dir)).get("regenerate"):
            return False
    except FileNotFoundError:  # a folder holding only token_freq.json
        return False
    try:
        doc = _read(out_dir)
    except (OSError, ValueError):
        return True
    samples = doc.get("samples")
    return (
        doc.get("counted") != COMMITTED
        or type(samples) is not int
        or samples < len(load(Path(out_dir)))
    )


def _read(out_dir: str) -> dict:
    """token_freq.json as an object (a regular file inside the dataset folder)."""
    return read_json_object(Path(out_dir) / TOKEN_FREQ, out_dir, TOKEN_FREQ_LIMIT)


def write_committed_token_freq(out_dir: str, target_vocab_size: Optional[int] = None) -> Path:
    """OUT/token_freq.json counted over what the dataset stores: the committed samples'
    input_ids and loss_mask, read back (ids and masks only). With regenerated answers these
    are not the source dataset's tokens. Written by the job that completes the dataset
    (`count_if_complete`) or by `hsdump vocab`; a file that already counts more committed
    samples (another job's) is kept, checked and replaced under the dataset's lock."""
    from hsdump.store.commits import dataset_lock

    counts, samples = committed_counts(out_dir)
    path = Path(out_dir) / TOKEN_FREQ
    with dataset_lock(Path(out_dir)):  # jobs ending together: the larger count wins
        if path.exists():
            try:
                old = _read(out_dir)
            except (OSError, ValueError):
                old = {}
            if (
                old.get("counted") == COMMITTED
                and type(old.get("samples")) is int
                and old["samples"] > samples
            ):
                return path
        return _write(counts, samples, out_dir, target_vocab_size, COMMITTED)


def committed_counts(out_dir: str) -> Tuple[np.ndarray, int]:
    """(dense counts by token id, samples counted) over the committed samples' loss-masked
    input_ids, read back from the shards (ids and masks only, no hidden states)."""
    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(out_dir, allow_dry=True)
    counts = np.zeros(0, dtype=np.int64)
    for sid in ds.ids:
        rec = ds.get(sid, hidden=False)
        counts = _add_counts(counts, rec["input_ids"].numpy(), rec["loss_mask"].numpy())
    return counts, len(ds.ids)


def committed_frequencies(out_dir: str) -> Tuple[Dict[int, int], Dict[str, Any]]:
    """What read_token_freq would give for a token_freq.json written now, without writing it
    (for a dataset folder that cannot be written)."""
    counts, samples = committed_counts(out_dir)
    freq = _as_dict(counts)
    return freq, freq_fields(freq, samples, None, COMMITTED)


def freq_fields(
    freq: Dict[int, int], samples: int, target_vocab_size: Optional[int], counted: str
) -> Dict[str, Any]:
    """token_freq.json's fields but `counts`."""
    return {
        "format": TOKEN_FREQ_FORMAT,
        "version": TOKEN_FREQ_VERSION,
        "counted": counted,
        "samples": samples,
        "loss_tokens": int(sum(freq.values())),
        "distinct": len(freq),
        "target_vocab_size": target_vocab_size,
    }


def _write(
    counts: np.ndarray, samples: int, out_dir: str, target_vocab_size: Optional[int], counted: str
) -> Path:
    return write_freq(_as_dict(counts), samples, out_dir, target_vocab_size, counted)


def write_freq(
    freq: Dict[int, int],
    samples: int,
    out_dir,
    target_vocab_size: Optional[int],
    counted: str,
    **extra: Any,
) -> Path:
    """OUT/token_freq.json, atomically: `freq` ({token id: count}, kept in its order), the
    format's fields and `extra` ones before `counts`."""
    if target_vocab_size is not None and freq and max(freq) >= target_vocab_size:
        raise Refusal(f"token id {max(freq)} >= target_vocab_size={target_vocab_size}")
    doc = {
        **freq_fields(freq, samples, target_vocab_size, counted),
        **extra,
        "counts": {str(k): v for k, v in freq.items()},
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / TOKEN_FREQ
    atomic_write(path, json.dumps(doc, separators=(",", ":")).encode())
    return path


def read_token_freq(out_dir: str) -> Tuple[Dict[int, int], Dict[str, Any]]:
    """({token id: count}, the file's other fields) from OUT/token_freq.json."""
    path = Path(out_dir) / TOKEN_FREQ
    if not path.exists():
        raise MissingInput(
            f"{path}: no token frequencies; they are written by the "
            "extraction run (hsdump.store.stats.write_token_freq)"
        )
    doc = _read(out_dir)
    counts = doc.pop("counts", None)
    if (
        doc.get("format") != TOKEN_FREQ_FORMAT
        or not isinstance(counts, dict)
        or not all(type(v) is int and v >= 0 for v in counts.values())
    ):
        raise Refusal(f"{path}: not an hsdump token_freq file (a format and counts of token ids)")
    try:
        return {int(k): v for k, v in counts.items()}, doc
    except ValueError:
        raise Refusal(f"{path}: its counts name token ids that are not integers") from None
