"""`python -m hsdump preview [OVERRIDES...]`: rendered samples with the loss-masked tokens marked.

Takes the same Hydra overrides as extract.py, e.g.

    python -m hsdump preview dataset=sharegpt_v3 model=llama3_8b -n 2
    python -m hsdump preview dataset.path=my.jsonl model.chat_template=qwen3_nothink.jinja

and prints the first samples (from `--start`) exactly as they would be tokenized: text the
drafter is trained on (loss_mask = 1) in green, or between [[ and ]] with --color never (the
default when the output is not a terminal); the rest as is. Rows that would be skipped are
shown with their reason. Only the tokenizer is loaded: no engine, no model weights (the tiny
presets' folders are built on first use).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from typing import List, Optional

from hsdump.command import config_dir

CONF = config_dir()  # the checkout's conf/, or hsdump/conf inside an installed wheel
GREEN, DIM, BOLD, RESET = "\x1b[32m", "\x1b[2m", "\x1b[1m", "\x1b[0m"


def compose_config(overrides: List[str]):
    from hydra import compose, initialize_config_dir

    from hsdump.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_config(compose("config", overrides=list(overrides)))


def groups(ids: List[int], mask: List[int]):
    """Runs of consecutive tokens with the same mask value: (start, end, masked)."""
    out, a = [], 0
    for j in range(1, len(ids) + 1):
        if j == len(ids) or mask[j] != mask[a]:
            out.append((a, j, bool(mask[a])))
            a = j
    return out


def render_sample(
    tok, ids: List[int], mask: List[int], color: bool, max_tokens: Optional[int] = None
) -> str:
    """The decoded sample with masked runs colored (or bracketed [[...]])."""
    cut = ids if max_tokens is None else ids[:max_tokens]
    parts = []
    for a, b, m in groups(cut, mask[: len(cut)]):
        text = tok.decode(cut[a:b], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if m:
            parts.append(f"{GREEN}{text}{RESET}" if color else f"[[{text}]]")
        else:
            parts.append(f"{DIM}{text}{RESET}" if color else text)
    if len(cut) < len(ids):
        parts.append(f"\n... ({len(ids) - len(cut)} more tokens)")
    return "".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hsdump preview",
        description="show rendered samples with the loss-masked tokens marked",
        epilog="OVERRIDES: Hydra overrides as for "
        "extract.py, e.g. dataset=sharegpt_v3 model=qwen3_8b "
        "model.chat_template=qwen3_nothink.jinja",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (key=value)")
    ap.add_argument("-n", "--num", type=int, default=3, help="samples to show (default 3)")
    ap.add_argument("--start", type=int, default=0, help="first row to show")
    ap.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="show at most this many tokens per sample"
    )
    args = ap.parse_args(argv)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())

    from omegaconf.errors import OmegaConfBaseException

    from hsdump.capture.layers import check_length_limit, length_limit, read_model_info
    from hsdump.corpus.chat import chat_template_of, has_generation_markers
    from hsdump.corpus.formats import detect_format
    from hsdump.corpus.sources import load_rows
    from hsdump.corpus.tokenization import sample_fn
    from hsdump.corpus.tokenizer import load_tokenizer
    from hsdump.errors import Refusal, hydra_usage_error
    from hsdump.tiny import resolve_model_path

    try:
        cfg = compose_config(args.overrides)
        d = cfg.dataset
        want = args.start + args.num
        d.max_samples = want if d.max_samples is None else min(d.max_samples, want)
        path = resolve_model_path(cfg.model.path)
        info = read_model_info(path, cfg.model.trust_remote_code)
        check_length_limit(cfg, info)  # as extract: a limit the engine refuses is refused
        d.max_seq_len, limit_origin = length_limit(cfg, info)  # and the same limit
        tok = load_tokenizer(cfg.model, path)
        rows = load_rows(d)
        fmt, column = detect_format(rows, d)
    except Exception as e:  # a refusal, a path, an override: say what and stop (exit 2)
        if not (isinstance(e, (Refusal, OSError, OmegaConfBaseException)) or hydra_usage_error(e)):
            raise  # anything else is a failure with its traceback (exit 1): docs/errors.md
        print(f"hsdump preview: {e}", file=sys.stderr)
        return 2
    template = chat_template_of(tok)
    if fmt != "text" and not template:
        print(
            "hsdump preview: the tokenizer has no chat template; set model.chat_template=FILE",
            file=sys.stderr,
        )
        return 2
    fn = sample_fn(tok, template, fmt, column, d.max_seq_len, d.truncation, d.min_seq_len)
    how = (
        "every token (text)"
        if fmt == "text"
        else "{% generation %} markers"
        if has_generation_markers(template)
        else "incremental rendering (no {% generation %} markers)"
    )
    sha = hashlib.sha256((template or "").encode()).hexdigest()[:12]
    b, r = (BOLD, RESET) if color else ("", "")
    print(
        f"{b}dataset{r} {d.path} ({fmt}, column {column!r}); {b}tokenizer{r} "
        f"{cfg.model.tokenizer or cfg.model.path}; {b}template{r} "
        f"{cfg.model.chat_template or 'the tokenizer own'} (sha256 {sha}...); "
        f"{b}mask{r} from {how}; max_seq_len {d.max_seq_len} ({d.truncation}; "
        f"{limit_origin})"
    )
    print("loss-masked text is " + ("green" if color else "between [[ and ]]") + "\n")
    for idx in range(args.start, min(want, len(rows))):
        res = fn(rows[idx], idx)
        head = f"── row {idx}"
        if res["skip"]:
            detail = f": {res['detail']}" if res["detail"] else ""
            print(f"{b}{head}: skipped ({res['skip']}{detail}){r}\n")
            continue
        ids, mask = res["input_ids"], res["loss_mask"]
        trunc = ", truncated" if res["truncated"] else ""
        print(f"{b}{head}: {len(ids)} tokens, {sum(mask)} in the loss{trunc} ──{r}")
        print(render_sample(tok, ids, mask, color, args.max_tokens))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
