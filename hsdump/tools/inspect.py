"""`python -m hsdump inspect OUT [--png FILE] [--json]`: a dataset's facts and length histograms.

Prints samples (of how many the run planned: a partial dataset says so, and that the same
command resumes it), tokens, loss-masked tokens, bytes, layers, model, storage dtype and skipped
rows (both kinds: rows the tokenizer's length policy left out, from
manifest["dataset"]["skipped_rows"], and samples the writer refused, from the commit
records), and draws a PNG with histograms of sequence lengths and of the loss-masked
fraction per sample (pillow only). Reads the commit records (version 2 records carry each
sample's length and loss-masked count; version 1 masks are read), never hidden states.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import List, Sequence, Tuple

from hsdump.errors import Refusal
from hsdump.store.commits import read_manifest
from hsdump.store.files import size_text as _size


def _obj(x) -> dict:
    return x if isinstance(x, dict) else {}


def _counts(x) -> dict:
    """A {reason: count} object from the manifest, keeping only integer counts."""
    return {str(k): v for k, v in _obj(x).items() if type(v) is int}


def gather(path: str, progress: bool = False) -> Tuple[dict, List[int], List[float]]:
    """(facts, per-sample lengths, per-sample loss-masked fractions). `facts["problems"]`
    counts the damaged commit records left out (what `hsdump verify` lists)."""
    read_manifest(Path(path))  # a folder that is no dataset is refused before torch loads
    from hsdump.store.reader import HsdumpDataset

    ds = HsdumpDataset(path, allow_dry=True)  # its facts, not its rows: a dry one is said
    m = ds.manifest
    lengths = ds.lengths
    if ds.version == 1 and progress and len(ds) > 2000:  # version 1: reads every mask
        print(
            f"reading {len(ds):,} loss masks (version 1 records carry no counts)", file=sys.stderr
        )
    masked: List[int] = ds.masked_counts()
    fracs = [k / n if n else 0.0 for k, n in zip(masked, lengths)]
    shard_bytes = sum(int(b or 0) for b in ds.commits.nbytes)
    model = _obj(m.get("model"))
    data = _obj(m.get("dataset"))
    refused = Counter(str(r) for r in ds.skipped.values())
    tokens = sum(lengths)
    pg = ds.progress
    facts = {
        "path": str(Path(path).resolve()),
        "format": f"{m.get('format')} v{ds.version}",
        "hsdump_version": m.get("hsdump_version"),
        "engine": m.get("engine") or "sglang",
        "model": model.get("path"),
        "architecture": model.get("architecture"),
        "hidden_size": model.get("hidden_size"),
        "num_hidden_layers": model.get("num_hidden_layers"),
        "model_dtype": model.get("dtype"),
        "layers": ds.layers,
        "convention": m.get("convention"),
        "final_states": ds.final_kinds,
        "storage_dtype": ds.storage_dtype,
        "samples": len(lengths),
        "progress": pg.to_dict(),
        "partial": pg.line() or None,
        "tokens": tokens,
        "loss_masked_tokens": sum(masked),
        "loss_masked_fraction": (sum(masked) / tokens) if tokens else 0.0,
        "seq_len": (
            {
                "min": min(lengths),
                "median": statistics.median(lengths),
                "mean": tokens / len(lengths),
                "max": max(lengths),
            }
            if lengths
            else {}
        ),
        "bytes": shard_bytes,
        "shards": len(ds.commits.names),
        "bytes_per_sample": shard_bytes / len(lengths) if lengths else 0,
        "bytes_per_token": shard_bytes / tokens if tokens else 0,
        "source": {k: data.get(k) for k in ("path", "name", "split", "rows") if k in data},
        "max_seq_len": m.get("max_seq_len"),
        "truncation": m.get("truncation"),
        "truncated": _obj(m.get("tokenized")).get("truncated"),
        "skipped_rows": _counts(data.get("skipped_rows")),
        "skipped_samples": dict(refused),
        "no_loss_samples": sum(1 for k in masked if k == 0),
        "problems": len(ds.problems),
        "first_problem": ": ".join(ds.problems[0]) if ds.problems else None,
    }
    return facts, lengths, fracs


def _q(v) -> str:
    return "?" if v is None else str(v)


def _num(v) -> str:
    if v is None:
        return "?"
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def format_facts(f: dict) -> str:
    sl = f["seq_len"]
    skipped_rows = sum(f["skipped_rows"].values())
    skipped_samples = sum(f["skipped_samples"].values())
    rows = [
        ("dataset", f["path"]),
        ("format", f"{f['format']} (hsdump {_q(f['hsdump_version'])})"),
        (
            "engine",
            f["engine"]
            + (
                " (rows are a function of the token ids, not hidden states: export and the "
                "loader refuse it unless asked)"
                if f["engine"] == "dry"
                else ""
            ),
        ),
        (
            "model",
            f"{_q(f['model'])} ({_q(f['architecture'])}, hidden {_q(f['hidden_size'])}, "
            f"{_q(f['num_hidden_layers'])} layers, {_q(f['model_dtype'])})",
        ),
        (
            "layers",
            f"{f['layers']} ({_q(f['convention'])})"
            + (f" + final {', '.join(f['final_states'])}" if f["final_states"] else ""),
        ),
        ("storage dtype", f["storage_dtype"]),
        ("samples", f"{f['samples']:,}" + _of_planned(f["progress"])),
        (
            "tokens",
            f"{f['tokens']:,}  (seq len min {_num(sl.get('min'))}, median "
            f"{_num(sl.get('median'))}, mean {_num(sl.get('mean'))}, "
            f"max {_num(sl.get('max'))})",
        ),
        (
            "loss-masked",
            f"{f['loss_masked_tokens']:,} tokens ({f['loss_masked_fraction']:.1%});"
            f" {f['no_loss_samples']} samples with none",
        ),
        (
            "bytes",
            f"{_size(f['bytes'])} in {f['shards']} shards "
            f"({_size(f['bytes_per_sample'])}/sample, {f['bytes_per_token']:,.0f} B/token)",
        ),
        ("source", ", ".join(f"{k}={v}" for k, v in f["source"].items()) or "?"),
        (
            "max_seq_len",
            f"{_q(f['max_seq_len'])} (truncation: {_q(f['truncation'])}"
            + (
                f"; {f['truncated']} samples cut at it)"
                if f.get("truncated")
                else "; none cut at it)"
                if f.get("truncated") == 0
                else ")"
            ),
        ),
        (
            "skipped rows",
            f"{skipped_rows}"
            + (
                " (" + ", ".join(f"{k}: {v}" for k, v in sorted(f["skipped_rows"].items())) + ")"
                if skipped_rows
                else ""
            )
            + "  [input rows left out before capture]",
        ),
        (
            "skipped samples",
            f"{skipped_samples}"
            + (
                " (" + ", ".join(f"{k}: {v}" for k, v in sorted(f["skipped_samples"].items())) + ")"
                if skipped_samples
                else ""
            )
            + "  [captured, refused by the writer]",
        ),
    ]
    if f["partial"]:
        rows.append(("PARTIAL", f["partial"].removeprefix("partial: ")))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def _of_planned(p: dict) -> str:
    """' of M planned' (and how many the writer refused), or '' when the plan is unknown."""
    if p.get("planned") is None:
        return ""
    refused = f", {p['refused']:,} refused" if p.get("refused") else ""
    return f" of {p['planned']:,} planned{refused}" + ("" if p.get("complete") else " (partial)")


# ---------------------------------------------------------------------- the PNG (pillow)
def _nice_step(span: float, target: int = 5) -> float:
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _hist(values: Sequence[float], lo: float, hi: float, bins: int) -> List[int]:
    counts = [0] * bins
    width = (hi - lo) / bins
    for v in values:
        k = int((v - lo) / width) if width > 0 else 0
        counts[min(max(k, 0), bins - 1)] += 1
    return counts


def _fmt_tick(v: float, step: float) -> str:
    if step >= 1 and float(v).is_integer():
        v = int(v)
        return f"{v // 1000}k" if v >= 10000 and v % 1000 == 0 else f"{v:,}"
    return f"{v:.3f}".rstrip("0").rstrip(".")


def _panel(img, draw, font, small, box, values, lo, hi, bins, title, xlabel, color, stats):
    x0, y0, x1, y1 = box
    left, bottom, top, right = x0 + 70, y1 - 60, y0 + 60, x1 - 20
    draw.text(((x0 + x1) // 2, y0 + 18), title, font=font, fill="black", anchor="mm")
    draw.text(((x0 + x1) // 2, y0 + 40), stats, font=small, fill="#444444", anchor="mm")
    counts = _hist(values, lo, hi, bins)
    cmax = max(counts) if counts else 1
    ystep = _nice_step(cmax, 5)
    ytop = max(ystep, math.ceil(cmax / ystep) * ystep)
    H, W = bottom - top, right - left
    # grid and y ticks
    v = 0.0
    while v <= ytop + 1e-9:
        y = bottom - H * v / ytop
        draw.line([(left, y), (right, y)], fill="#e6e6e6")
        draw.text((left - 8, y), _fmt_tick(v, ystep), font=small, fill="black", anchor="rm")
        v += ystep
    # bars
    bw = W / bins
    for k, c in enumerate(counts):
        if c:
            bx0 = left + k * bw
            draw.rectangle(
                [bx0 + 1, bottom - H * c / ytop, bx0 + bw - 1, bottom],
                fill=color,
                outline="#333333",
            )
    # axes and x ticks
    draw.line([(left, top), (left, bottom), (right, bottom)], fill="black", width=2)
    xstep = _nice_step(hi - lo, 6)
    v = math.ceil(lo / xstep) * xstep
    while v <= hi + 1e-9:
        x = left + W * (v - lo) / (hi - lo)
        draw.line([(x, bottom), (x, bottom + 5)], fill="black")
        draw.text((x, bottom + 8), _fmt_tick(v, xstep), font=small, fill="black", anchor="ma")
        v += xstep
    draw.text(((left + right) // 2, y1 - 22), xlabel, font=small, fill="black", anchor="mm")
    # y label, rotated
    from PIL import Image, ImageDraw

    lab = Image.new("RGBA", (160, 24), (255, 255, 255, 0))
    ImageDraw.Draw(lab).text((80, 12), "samples", font=small, fill="black", anchor="mm")
    lab = lab.rotate(90, expand=True)
    img.paste(lab, (x0 + 4, (top + bottom) // 2 - 80), lab)


def draw_png(path: str, facts: dict, lengths: List[int], fracs: List[float]) -> None:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (1400, 560), "white")
    d = ImageDraw.Draw(img)
    big, font, small = (ImageFont.load_default(size=s) for s in (22, 18, 14))
    head = (
        f"{Path(facts['path']).name}: {facts['samples']:,} samples, "
        f"{facts['tokens']:,} tokens, {_size(facts['bytes'])}, "
        f"layers {facts['layers']}, {facts['storage_dtype']}, model {facts['model']}"
    )
    d.text((700, 24), head, font=big, fill="black", anchor="mm")
    hi = max(lengths) if lengths else 1
    step = _nice_step(hi, 6)
    hi_edge = max(step, math.ceil(hi / step) * step)
    bins = 40
    sl = facts["seq_len"]
    _panel(
        img,
        d,
        font,
        small,
        (0, 50, 700, 560),
        lengths,
        0,
        hi_edge,
        bins,
        "Sequence length (tokens)",
        "tokens per sample",
        "#4c78a8",
        f"min {_num(sl.get('min'))} · median {_num(sl.get('median'))} · mean "
        f"{sl.get('mean', 0):,.0f} · max {_num(sl.get('max'))}"
        + (f" · max_seq_len {facts['max_seq_len']}" if facts["max_seq_len"] else ""),
    )
    mean_f = statistics.fmean(fracs) if fracs else 0.0
    _panel(
        img,
        d,
        font,
        small,
        (700, 50, 1400, 560),
        fracs,
        0.0,
        1.0,
        20,
        "Loss-masked fraction per sample",
        "loss-masked tokens / tokens",
        "#f58518",
        f"mean per sample {mean_f:.2f} · over all tokens "
        f"{facts['loss_masked_fraction']:.2f} · samples with none: {facts['no_loss_samples']}",
    )
    img.save(path)


def main(argv=None) -> int:
    from hsdump.command import prog

    p = argparse.ArgumentParser(
        prog=prog("inspect"),
        description="Print an hsdump dataset's facts; optionally plot "
        "its length and loss-mask histograms.",
    )
    p.add_argument("out", help="the dataset folder (output.dir)")
    p.add_argument("--png", default=None, help="write the histograms to this PNG file")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    a = p.parse_args(argv)
    try:
        facts, lengths, fracs = gather(a.out, progress=True)
    except (Refusal, OSError) as e:  # only a refusal or the path named exits 2 (docs/errors.md)
        print(f"{prog('inspect')}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(facts, indent=1) if a.json else format_facts(facts))
    if a.png:
        draw_png(a.png, facts, lengths, fracs)
        print(f"wrote {a.png}")
    if facts["problems"]:  # the figures above leave out what could not be read
        print(
            f"{prog('inspect')}: {a.out}: {facts['problems']} damaged commit records were "
            f"left out of these figures (e.g. {facts['first_problem']}); run "
            f"`{prog('verify')} {a.out}` for every problem",
            file=sys.stderr,
        )
        return 1
    return 0
