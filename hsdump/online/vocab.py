"""EAGLE-3's draft vocabulary map for a train-while-capturing run, with no offline data.

SpecForge 0.2.0 derives an EAGLE-3 map from offline data only (its assembly counts the
loss-masked ids of the feature files) and refuses an online run without
`model.vocab_mapping_path`. The capture knows every sample before it runs, so it counts them
(`write_counts`, at its plan): FOLDER/token_freq.json, hsdump's token_freq format, its counts
over the samples the trainer is fed. The consumer turns them into SpecForge's own map file
(`specforge_map`: SpecForge's `process_token_dict_to_mappings`, saved as SpecForge saves
its own) when run.yaml names none.

The map equals the one SpecForge's offline trainer derives from `hsdump export --to specforge`
of the same samples, ties included: SpecForge keeps the most common ids by
`Counter.most_common`, which breaks ties by the order ids were first counted (its files in
sorted path order, each file's ids ascending). The counts are written in that order, and
JSON keeps it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

import numpy as np

from hsdump.errors import Refusal
from hsdump.store.layout import TOKEN_FREQ
from hsdump.store.stats import read_token_freq, write_freq

COUNTED = (
    "input_ids where loss_mask == 1, of the samples the trainer is fed, in the order SpecForge "
    "0.2.0 first counts them offline (files in sorted path order, ids ascending)"
)


def ordered_counts(
    samples: Iterable[Tuple[Iterable[int], Iterable[int]]], chunk: int = 4096
) -> List[List[int]]:
    """[[token id, count], ...] over the loss-masked ids of `samples` ((input_ids, loss_mask)
    in SpecForge's file order), in the order SpecForge's Counter first meets each id: each
    sample's distinct ids ascending, sample after sample (`bench/online_counts.py` times it)."""
    total = np.zeros(0, dtype=np.int64)
    first = np.zeros(0, dtype=np.int64)  # per id: its first position in that sequence (+1)
    seen = 0  # positions so far
    sels, uniqs = [], []

    def flush() -> None:
        nonlocal total, first, seen
        if not sels:
            return
        every, seq = np.concatenate(sels), np.concatenate(uniqs)
        sels.clear(), uniqs.clear()
        if every.min() < 0:
            raise ValueError("negative token id in input_ids")
        size = max(total.size, int(every.max()) + 1)
        total = np.pad(total, (0, size - total.size))
        first = np.pad(first, (0, size - first.size))
        total += np.bincount(every, minlength=size)
        at = np.full(size, seq.size + 1, dtype=np.int64)
        np.minimum.at(at, seq, np.arange(1, seq.size + 1))  # each id's first position here
        new = (first == 0) & (at <= seq.size)
        first[new] = seen + at[new]
        seen += seq.size

    for ids, mask in samples:
        sel = np.asarray(ids, dtype=np.int64)[np.asarray(mask).astype(bool)]
        if sel.size:
            sels.append(sel)
            uniqs.append(np.unique(sel))
            if len(sels) >= chunk:
                flush()
    flush()
    met = np.nonzero(first)[0]
    order = met[np.argsort(first[met], kind="stable")]
    return [[int(t), int(total[t])] for t in order]


def write_counts(folder, pairs: List[List[int]], samples: int, max_tokens: int) -> Path:
    """FOLDER/token_freq.json: hsdump's token_freq format, its counts in `pairs`' order, and
    `max_tokens` (the longest sample: a trainer truncating shorter counts other tokens)."""
    freq = {t: c for t, c in pairs}  # in SpecForge's order
    return write_freq(freq, samples, folder, None, COUNTED, max_tokens=int(max_tokens))


class NoCounts(Exception):
    """The folder's counts are missing or do not fit the trainer: the message names the fix."""


def sizes(cfg) -> Tuple[int, int]:
    """(draft vocabulary, target vocabulary) of SpecForge run config `cfg`, as SpecForge's
    assembly reads them: the drafter config's `draft_vocab_size` (else its `vocab_size`) and
    the target model config's vocabulary."""
    from specforge.modeling.target.target_utils import load_target_config, target_vocab_size

    draft = json.loads(Path(cfg.model.draft_model_config).read_text())
    target = load_target_config(
        cfg.model.target_model_path,
        cache_dir=cfg.model.cache_dir,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    return int(draft.get("draft_vocab_size", draft["vocab_size"])), int(target_vocab_size(target))


def specforge_map(folder, cache_dir: str, draft_size: int, target_size: int,
                  max_length: Optional[int]) -> str:  # fmt: skip
    """SpecForge's vocabulary map file for the capture's counts (FOLDER/token_freq.json):
    built by SpecForge's own `process_token_dict_to_mappings`, saved as SpecForge saves the
    one it derives (a dict of d2t and t2d, torch.save) under CACHE_DIR/vocab_mapping/, named
    by the counts and sizes; written by each rank alike, atomically. Returns its path."""
    path = Path(folder) / TOKEN_FREQ
    if not path.exists():
        raise NoCounts(
            f"{path} is missing: an EAGLE-3 capture writes it with its plan (an older hsdump "
            "did not); run the capture command again with this hsdump, or give the trainer a "
            "map: model.vocab_mapping_path=<SpecForge's d2t/t2d file>"
        )
    try:
        freq, doc = read_token_freq(str(folder))  # in the file's order: SpecForge's tie order
    except Refusal as e:
        raise NoCounts(f"{e}; run the capture command again") from None
    longest = int(doc.get("max_tokens") or 0)
    if max_length is not None and longest > int(max_length):
        raise NoCounts(
            f"data.max_length={max_length} cuts samples the capture counted whole (up to "
            f"{longest} tokens, {path}): set data.max_length >= {longest}, or give the "
            "trainer a map: model.vocab_mapping_path=<SpecForge's d2t/t2d file>"
        )
    import torch
    from specforge.data.preprocessing import process_token_dict_to_mappings

    counts = Counter(freq)
    if counts and max(counts) >= target_size:
        raise NoCounts(
            f"{path} counts token id {max(counts)}, outside the target's vocabulary of "
            f"{target_size}: the run config's target is not the captured model"
        )
    text = json.dumps(list(freq.items()))
    key = hashlib.sha256(f"{text}:{target_size}:{draft_size}".encode()).hexdigest()[:32]
    out = Path(cache_dir) / "vocab_mapping" / f"hsdump-{key}.pt"
    if not out.exists():
        d2t, t2d = process_token_dict_to_mappings(counts, int(draft_size), int(target_size))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        torch.save({"d2t": d2t, "t2d": t2d}, tmp)
        os.replace(tmp, out)
    return str(out)
