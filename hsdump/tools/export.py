"""`python -m hsdump export OUT DEST --to FORMAT`: write an hsdump dataset in a peer's layout.

Formats (layouts read from the peers' own loaders, see docs/exporting.md):

  speculators     speculators 0.5-0.9: DEST/hidden_states/hs_{i}.safetensors with
                  `hidden_states` [seq, K+1, H] (K captured layers, then the verifier's final
                  state) and `token_ids` int64 [seq]; DEST itself is an Arrow dataset
                  (`datasets.save_to_disk`, torch format) with columns input_ids, loss_mask,
                  seq_len, row i describing hs_{i}; DEST/token_freq.pt is a dict
                  token id -> count over loss-masked tokens.
  speculators-v1  speculators 0.3-0.4: DEST/data_{i}.pt = torch.save({"input_ids",
                  "hidden_states": [K+1 tensors [seq, H]], "loss_mask"}), plus
                  data_config.json and sample_lengths.json (no .pt besides the samples:
                  that loader takes every *.pt under DEST as a sample).
  specforge       SpecForge 0.2.0: DEST/rows_{g}-{g+2000}/data_{i}.ckpt = torch.save({...}),
                  g = i - i % 2000; per `--kind`: eagle3 {"input_ids" [seq], "loss_mask"
                  [seq], "aux_hidden_state" [1, seq, K*H], "hidden_state" [1, seq, H]
                  (post-norm)}; dflash and domino {"input_ids", "loss_mask",
                  "hidden_states" [seq, K*H]}; dspark the same plus
                  "target_last_hidden_states" [seq, H] (post-norm).
  messages        the conversations a `regenerate.turns` run rewrote with the target model:
                  DEST/conversations.jsonl, one {"id", "messages"} object per sample (the
                  messages/ShareGPT-style input of SpecForge, speculators or hsdump itself);
                  no hidden states.

`--kind` (eagle3 by default; dflash for speculators; dflash, dspark, domino for SpecForge)
picks that drafter kind's layers out of the captured ones (the manifest's `kinds`, or the
kind's default for the model's depth: hsdump.capture.kinds) and refuses, naming the
re-extraction, when one was not captured; DEST/hsdump_export.json records the kind, its layers
and the SGLang serving ids the drafter's config must carry (`serving_ids`, also printed).

`i` is the sample's position in hsdump id order (0..n-1, after --min-len/--max-len), because
speculators pairs Arrow row i with hs_{i}; DEST/hsdump_export.json records the hsdump sample
id of every position.

The verifier's final state (`--final-state`): speculators applies the verifier's final norm
itself, so it gets the pre-norm final state; SpecForge stores the post-norm one. A dataset
without that capture is refused unless `--final-state last-layer` (a stand-in for plumbing
tests; see hsdump.store.reader.resolve_final_state).

Streaming: `--workers` samples at a time (default 8; each read with pread, not mapped, so
nothing stays resident, and its one output file built and written), so memory stays at about
twice that many samples. Resumable: each file is
written under a hidden temporary name, fsynced and renamed; a rerun with the same arguments
skips every final file that exists, and deletes stale temporaries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, as_completed, wait
from pathlib import Path
from typing import Callable, Dict, List, Optional

from hsdump import __version__
from hsdump.capture.kinds import EXPORT_KINDS
from hsdump.errors import Refusal
from hsdump.store.commits import read_manifest
from hsdump.store.files import read_json_object
from hsdump.store.layout import FINAL_KINDS, LAST_LAYER, check_not_dry

FORMATS = ("speculators", "speculators-v1", "specforge", "messages")
STATE = "hsdump_export.json"
SPECFORGE_GROUP = 2000
PREFER = {"speculators": "pre_norm", "speculators-v1": "pre_norm", "specforge": "post_norm"}
MESSAGES = "conversations.jsonl"
CONFIG_KEY = {
    "eagle3": "eagle_config.eagle_aux_hidden_state_layer_ids",
    "dflash": "dflash_config.target_layer_ids",
    "dspark": "dflash_config.target_layer_ids",
}
"""Where SGLang 0.5.23 reads a drafter's layer ids from its config.json, by the capture kind
whose layers it takes (models/llama_eagle3.py's loader; speculative/dflash_utils.py)."""


def rel_path(fmt: str, i: int) -> str:
    """Where sample position `i` goes under DEST."""
    if fmt == "speculators":
        return f"hidden_states/hs_{i}.safetensors"
    if fmt == "speculators-v1":
        return f"data_{i}.pt"
    if fmt == "specforge":
        g = i - i % SPECFORGE_GROUP
        return f"rows_{g}-{g + SPECFORGE_GROUP}/data_{i}.ckpt"
    raise Refusal(f"unknown format {fmt!r}; use one of {FORMATS}")


def _tmp_of(path: Path) -> Path:
    # a leading dot and a .tmp suffix: no peer loader's file pattern matches it
    return path.with_name(f".{path.name}.tmp")


def _commit(path: Path, write: Callable[[Path], None]) -> int:
    """`write(tmp)`, fsync, rename to `path`; returns the bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_of(path)
    write(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    size = tmp.stat().st_size
    os.replace(tmp, path)
    return size


def _torch_save(obj) -> Callable[[Path], None]:
    import torch

    return lambda tmp: torch.save(obj, tmp)


def _json(obj) -> Callable[[Path], None]:
    return lambda tmp: tmp.write_text(json.dumps(obj, indent=1) + "\n")


# ---------------------------------------------------------------------- per-format records
def specforge_record(rec: dict, final: Optional[str], pick: Optional[List[int]], kind: str) -> dict:
    """Sample `rec` (HsdumpDataset.get's) as SpecForge 0.2.0's offline record of drafter
    `kind` (`--to specforge`; what hsdump.online's store hands its offline normalizer too)."""
    import torch

    from hsdump.store.reader import verifier_state

    hs: List[torch.Tensor] = list(rec["hidden_states"])
    if pick is not None:
        hs = [hs[j] for j in pick]
    if kind != "eagle3":
        # SpecForge's DFlash-family records (dflash_family_data.normalize_offline_sample)
        out = {
            "input_ids": rec["input_ids"],
            "loss_mask": rec["loss_mask"],
            "hidden_states": torch.cat(hs, dim=-1).contiguous(),
        }
        if kind == "dspark":  # normalize_dspark_offline_sample: the post-norm final state
            out["target_last_hidden_states"] = verifier_state(rec, final).contiguous()
        return out
    return {
        "input_ids": rec["input_ids"],
        "loss_mask": rec["loss_mask"],
        "aux_hidden_state": torch.cat(hs, dim=-1).unsqueeze(0),
        "hidden_state": verifier_state(rec, final).contiguous().unsqueeze(0),
    }


def cast_states(rec: dict, dtype: str, pick: Optional[List[int]] = None) -> dict:
    """`rec` with its hidden states at positions `pick` (all when None) and its final states
    in `dtype` (the others, which the export does not write, as they are)."""
    import torch

    to = getattr(torch, dtype)
    keep = set(range(len(rec["hidden_states"])) if pick is None else pick)
    hs = [h.to(to) if j in keep else h for j, h in enumerate(rec["hidden_states"])]
    out = dict(rec, hidden_states=hs)
    if rec.get("final"):
        out["final"] = {k: v.to(to) for k, v in rec["final"].items()}
    return out


def sample_writer(
    fmt: str,
    rec: dict,
    final: Optional[str],
    pick: Optional[List[int]] = None,
    kind: str = "eagle3",
) -> Callable[[Path], None]:
    """A function writing sample `rec` in format `fmt` to a path: the hidden states at
    positions `pick` of the captured layers (all of them when None), for drafter `kind`."""
    import torch

    from hsdump.store.reader import verifier_state

    hs: List[torch.Tensor] = list(rec["hidden_states"])
    if pick is not None:
        hs = [hs[j] for j in pick]
    if fmt == "specforge":
        return _torch_save(specforge_record(rec, final, pick, kind))
    v = verifier_state(rec, final)
    if fmt == "speculators":
        from safetensors.torch import save_file

        stacked = torch.stack(hs + [v], dim=1)  # [seq, K+1, H]
        ids = rec["input_ids"].to(torch.int64).contiguous()
        return lambda tmp: save_file({"hidden_states": stacked, "token_ids": ids}, str(tmp))
    if fmt == "speculators-v1":
        return _torch_save(
            {
                "input_ids": rec["input_ids"],
                "hidden_states": hs + [v],
                "loss_mask": rec["loss_mask"],
            }
        )
    raise Refusal(f"unknown format {fmt!r}")


# ---------------------------------------------------------------------- the export
class ExportError(Refusal):
    pass


def _prepare_dest(dest: Path, state: dict, overwrite: bool) -> None:
    spath = dest / STATE
    if spath.exists():
        try:
            old = read_json_object(spath)
        except ValueError as e:
            if not overwrite:
                raise ExportError(
                    f"{e}: {dest} holds an export whose state cannot be read; "
                    "use --overwrite to start over, or another DEST"
                ) from None
            old = {}
        keys = ("to", "kind", "final_state", "layers", "ids", "dtype")
        old = {"kind": "eagle3", **old}  # an export from before --kind
        diff = [k for k in keys if old.get(k) != state.get(k)]
        if diff and not overwrite:
            what = ", ".join(
                "ids (the source's samples or the length filter changed)"
                if k == "ids"
                else f"{k}: {old.get(k)!r} -> {state.get(k)!r}"
                for k in diff
            )
            raise ExportError(
                f"{dest} holds a different export ({what}); it cannot resume. "
                "Use another DEST, or --overwrite to start over."
            )
        if diff:
            shutil.rmtree(dest)
    elif dest.exists() and any(dest.iterdir()):
        raise ExportError(
            f"{dest} is not empty and holds no hsdump export; choose an empty or new folder"
        )
    dest.mkdir(parents=True, exist_ok=True)
    for p in list(dest.rglob(".*.tmp")):  # an interrupted run's half-written files
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()


def _write_state(dest: Path, state: dict) -> None:
    _commit(dest / STATE, _json(state))


def export(
    src: str,
    dest: str,
    fmt: str,
    *,
    final_state: str = "auto",
    min_len: Optional[int] = None,
    max_len: Optional[int] = None,
    overwrite: bool = False,
    progress: bool = True,
    allow_dry: bool = False,
    workers: int = 8,
    kind: str = "eagle3",
    allow_partial: bool = False,
    dtype: Optional[str] = None,
) -> Dict[str, int]:
    """Export dataset `src` to `dest` in format `fmt` for drafter `kind`; returns counts
    (written, skipped, bytes). A dataset of engine=dry is refused unless `allow_dry`. `workers`
    samples are written at once (threads: reading, torch and the fsync release the GIL). A
    partial dataset (fewer samples than its run planned) is refused unless `allow_partial`.
    `dtype` (float32, bfloat16, float16): the hidden states are written in it (SpecForge feeds
    its records to the drafter as stored: a float32 drafter on the CPU needs float32 ones);
    None: as stored."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    offered = EXPORT_KINDS.get(fmt, ("eagle3",) if fmt != "messages" else None)
    if offered is not None and kind not in offered:
        why = (
            " (SGLang refuses speculators-trained DSpark drafters, sglang #30261: use --to "
            "specforge)"
            if fmt == "speculators" and kind == "dspark"
            else ""
        )
        raise ExportError(f"--to {fmt} --kind {kind}: {fmt} takes --kind {', '.join(offered)}{why}")
    # a folder that is no dataset, or a dry one, is refused before torch loads
    check_not_dry(src, read_manifest(Path(src)), allow_dry, "hsdump export --allow-dry")
    from hsdump.store.reader import HsdumpDataset, resolve_final_state

    ds = HsdumpDataset(src, min_len=min_len, max_len=max_len, mmap=False, allow_dry=allow_dry)
    if ds.problems:
        raise ExportError(
            f"{src}: {len(ds.problems)} damaged commit records (e.g. "
            f"{': '.join(ds.problems[0])}); an export would silently lack their "
            f"samples. Run `hsdump verify {src}` for every problem"
        )
    part = ds.progress
    if part.partial and not allow_partial:
        raise ExportError(
            f"{src} is {part.line()} (the extraction that writes it), then export it; or "
            f"pass --allow-partial to export the {part.committed:,} samples it holds "
            '(hsdump_export.json then records "complete": false)'
        )
    if not len(ds):
        raise ExportError(f"{src}: no sample to export (length filter {min_len}..{max_len})")
    if fmt == "messages":
        return export_messages(ds, Path(dest), progress)
    chosen = pick_kind(ds, read_manifest(Path(src)), kind)
    if fmt == "specforge" and kind in ("dflash", "domino"):
        final = None  # SpecForge's DFlash-family records hold no final state
    else:
        final = resolve_final_state(ds, final_state, prefer=PREFER[fmt])
    if kind == "dspark" and final != "post_norm":
        raise ExportError(
            f"{src}: a DSpark record's target_last_hidden_states is the post-norm final state "
            f"(SpecForge feeds it to lm_head), not {final!r}: extract with "
            "capture.kinds=[...,dspark] (or capture.final=[post_norm]) and export with "
            "--final-state auto"
        )
    if final is None and not (fmt == "specforge" and kind in ("dflash", "domino")):
        raise ExportError(
            f"{fmt} needs the verifier's final state: pass --final-state "
            f"pre_norm, post_norm or {LAST_LAYER}"
        )
    for name in ds.commits.names:  # a record promising samples its shard lacks: refused
        ds.header(name)  # here, before anything is written (each header is read once)
    dest_p = Path(dest)
    state = {
        "tool": "hsdump export",
        "hsdump_version": __version__,
        "to": fmt,
        "source": str(Path(src).resolve()),
        "final_state": final,
        "layers": ds.layers,
        "kind": kind,
        "kind_layers": chosen["layers"],
        "serving_ids": chosen["serving_ids"],
        "serving_ids_key": chosen["config_key"],
        "serving_class": chosen["architecture"],
        "min_len": min_len,
        "max_len": max_len,
        "complete": False,
        # the source run's progress: complete is true only for a finished export of a
        # finished dataset (an --allow-partial export of a partial one stays false)
        "source_samples": part.committed,
        "source_refused": part.refused,
        "source_planned": part.planned,
        "ids": ds.ids,
        **({"dtype": dtype} if dtype else {}),  # an export without it: as stored
    }
    _prepare_dest(dest_p, state, overwrite)
    old = json.loads((dest_p / STATE).read_text()) if (dest_p / STATE).exists() else {}
    if old.get("finished", old.get("complete")):  # exports before 2026-12-03: complete alone
        return {"written": 0, "skipped": len(ds), "bytes": 0}
    _write_state(dest_p, state)

    from tqdm import tqdm

    counts = {"written": 0, "skipped": 0, "bytes": 0}
    t0 = time.time()
    bar = tqdm(
        total=len(ds), unit="sample", desc=f"export {fmt}", disable=not progress, dynamic_ncols=True
    )

    def one(sid: int, path: Path) -> int:  # read, build, write, fsync, rename: one sample
        rec = ds.get(sid)
        if dtype:
            rec = cast_states(rec, dtype, chosen["pick"])
        return _commit(path, sample_writer(fmt, rec, final, chosen["pick"], kind))

    def done(f) -> None:
        counts["bytes"] += f.result()  # a worker's error stops the export here
        counts["written"] += 1
        bar.update(1)
        el = max(time.time() - t0, 1e-9)
        bar.set_postfix_str(
            f"{counts['bytes'] / 2**20 / el:,.0f} MiB/s, {counts['skipped']} already done",
            refresh=False,
        )

    # `workers` samples in flight: each file's fsync waits on the disk, not on the others
    # (one at a time, the fsync latency bounded the export at 16.6 samples/s on the GPU host)
    workers = max(1, workers)
    pool = ThreadPoolExecutor(max_workers=workers)
    pending: set = set()  # at most 2 x workers - 1 samples read (one worker: strictly in order)
    try:
        for i, sid in enumerate(ds.ids):
            path = dest_p / rel_path(fmt, i)
            if path.exists():
                counts["skipped"] += 1
                bar.update(1)
                continue
            if len(pending) >= 2 * workers - 1:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    done(f)
            pending.add(pool.submit(one, sid, path))
        for f in as_completed(pending):
            done(f)
        pending = set()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)
        bar.close()

    if fmt == "speculators":
        _write_arrow_and_freq(ds, dest_p)
    elif fmt == "speculators-v1":
        lengths = ds.lengths
        _commit(dest_p / "sample_lengths.json", _json({str(i): n for i, n in enumerate(lengths)}))
        _commit(
            dest_p / "data_config.json",
            _json(
                {
                    "format": "speculators-v1",
                    "source": "hsdump",
                    "hsdump_source": state["source"],
                    "layers": ds.layers,
                    "verifier_state": final,
                    "hidden_size": ds.hidden_size,
                    "num_samples": len(ds),
                    "num_tokens": sum(lengths),
                }
            ),
        )
    state["finished"] = True
    state["complete"] = not part.partial
    _write_state(dest_p, state)
    return counts


def pick_kind(ds, manifest: dict, kind: str) -> dict:
    """Drafter `kind`'s layers out of dataset `ds`'s: `layers` (hf_hidden_states_index),
    `pick` (their positions among the captured ones), `serving_ids` (what SGLang's class needs
    in the drafter's config to serve them, None where hsdump has no checked rule), and
    `config_key`. From the manifest's `kinds` when it recorded the kind, else the kind's
    default for the model's depth (EAGLE-3: every captured layer, in their order, as hsdump
    exported before kinds were recorded). ExportError naming the re-extraction when a layer
    is missing."""
    from hsdump.capture.families import kind_rule
    from hsdump.capture.kinds import KINDS, LAYERS_OF, serving_ids

    base = LAYERS_OF.get(kind, kind)
    model = manifest.get("model") or {}
    arch, depth = model.get("architecture"), model.get("num_hidden_layers")
    rec = (manifest.get("kinds") or {}).get(base)
    sglang = manifest.get("sglang_version")
    if rec is not None:
        want, ids = [int(k) for k in rec["layers"]], rec.get("serving_ids")
    else:
        if base == "eagle3" or depth is None:
            want = list(ds.layers)
        else:
            want = KINDS[base].default_layers(int(depth))
        version = None if sglang in (None, "absent") else sglang
        ids = serving_ids(kind_rule(arch, base, version), want) if arch else None
    missing = [k for k in want if k not in ds.layers]
    if missing:
        from hsdump.capture.families import CHECKED, kind_advice, kind_support

        kinds = list((manifest.get("kinds") or {"eagle3": None}).keys())
        again = ",".join(dict.fromkeys(kinds + [base]))
        version = None if sglang in (None, "absent") else sglang
        have = f"{ds.path} holds layers {ds.layers}, not {missing} of {base}'s {want}"
        if base != "eagle3" and arch and kind_support(arch, base, version) != CHECKED:
            # what extract would refuse: say so, and what to do instead (one text with it)
            raise ExportError(f"{have}. {kind_advice(arch, base, version)}")
        raise ExportError(
            f"{have}: extract again with capture.kinds=[{again}] (the union of their layers), "
            f"or with capture.kind_layers.{base}=[...] naming layers it captured"
        )
    return {
        "layers": want,
        "pick": [ds.layers.index(k) for k in want],
        "serving_ids": ids,
        "config_key": CONFIG_KEY[base],
        "architecture": arch,
    }


def export_messages(ds, dest: Path, progress: bool) -> Dict[str, int]:
    """DEST/conversations.jsonl: each sample's regenerated conversation, in id order (one
    shard header read per shard; written under a temporary name, then renamed). A dataset
    without any is refused before DEST is made."""
    from tqdm import tqdm

    if not any(
        "conversations" in (ds.header(name).get("__metadata__") or {}) for name in ds.commits.names
    ):
        raise ExportError(
            f"{ds.path} holds no regenerated conversations (it was extracted "
            "with regenerate.turns=none: its source dataset has the messages)"
        )

    missing = 0
    n = 0

    def write(tmp: Path) -> None:
        nonlocal missing, n
        with open(tmp, "w") as f:
            for sid in tqdm(ds.ids, unit="sample", desc="export messages", disable=not progress):
                conv = ds.conversation(sid)
                if conv is None:
                    missing += 1
                    continue
                f.write(json.dumps({"id": sid, "messages": conv}, ensure_ascii=False) + "\n")
                n += 1

    nbytes = _commit(dest / MESSAGES, write)  # fsyncs and renames
    if missing == len(ds):
        (dest / MESSAGES).unlink()
        raise ExportError(
            f"{ds.path} holds no regenerated conversations (it was extracted "
            "with regenerate.turns=none: its source dataset has the messages)"
        )
    return {"written": n, "skipped": missing, "bytes": nbytes}


def _write_arrow_and_freq(ds, dest: Path) -> None:
    """The Arrow dataset (row i <-> hs_{i}) and token_freq.pt, from ids and masks only."""
    import datasets

    datasets.disable_progress_bars()
    freq: Counter = Counter()

    def rows():
        for sid in ds.ids:
            r = ds.get(sid, hidden=False)
            ids, mask = r["input_ids"], r["loss_mask"]
            u, c = ids[mask.bool()].unique(return_counts=True)
            freq.update(dict(zip(u.tolist(), c.tolist())))
            yield {"input_ids": ids.tolist(), "loss_mask": mask.tolist(), "seq_len": len(ids)}

    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int64")),
            "loss_mask": datasets.List(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
        }
    )
    work = dest / ".arrow.tmp"
    shutil.rmtree(work, ignore_errors=True)
    try:
        # a fresh cache folder: no fingerprint can make datasets reuse a stale table
        table = datasets.Dataset.from_generator(
            rows, features=features, cache_dir=str(work / "cache")
        )
        table.set_format("torch")
        table.save_to_disk(str(work / "out"))
        for p in dest.glob("data-*-of-*.arrow"):
            p.unlink()
        names = sorted(os.listdir(work / "out"), key=lambda n: n == "state.json")
        for name in names:  # state.json last: it names the arrow files
            os.replace(work / "out" / name, dest / name)
        _commit(dest / "token_freq.pt", _torch_save(dict(freq)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------------- CLI
def no_ids_reason(out: str, kind: str) -> str:
    """Why an export of `kind` from dataset `out` has no SGLang serving ids: SGLang cannot serve
    the kind on the class, or hsdump has no checked rule (hsdump.capture.families.kind_advice,
    the text extract refuses with), or the rule gives none for these layers."""
    from hsdump.capture.families import CHECKED, kind_advice, kind_support
    from hsdump.capture.kinds import LAYERS_OF
    from hsdump.store.commits import read_manifest

    m = read_manifest(Path(out))
    arch = (m.get("model") or {}).get("architecture")
    sglang = m.get("sglang_version")
    version = None if sglang in (None, "absent") else sglang
    base = LAYERS_OF.get(kind, kind)
    if arch and kind_support(arch, base, version) != CHECKED:
        if base != "eagle3":
            return kind_advice(arch, base, version)
        return (
            "hsdump has no checked EAGLE-3 rule for this class: read the ids from SGLang's "
            'class before serving (docs/layers.md, "Drafter kinds")'
        )
    return (
        'its setter\'s rule gives none for these layers (docs/layers.md, "Drafter kinds": '
        "an EAGLE-3 capture starting at layer 1 of a DeepSeek-V2-style class)"
    )


def main(argv=None) -> int:
    from hsdump.command import prog

    p = argparse.ArgumentParser(
        prog=prog("export"),
        description="Write an hsdump dataset in a peer trainer's layout (streaming, resumable).",
    )
    p.add_argument("out", help="the hsdump dataset (output.dir of an extraction)")
    p.add_argument("dest", help="where to write the export")
    p.add_argument("--to", required=True, choices=FORMATS)
    p.add_argument(
        "--kind",
        default="eagle3",
        choices=EXPORT_KINDS["specforge"],
        help="drafter kind whose layers (and records) to write: eagle3 (default); dflash "
        "(specforge, speculators); dspark, domino (specforge)",
    )
    p.add_argument(
        "--final-state",
        default="auto",
        choices=("auto", *FINAL_KINDS, LAST_LAYER),
        help="what fills the verifier's final-state slot; auto: pre_norm for "
        "speculators*, post_norm for specforge (refused if not captured); "
        f"{LAST_LAYER}: the last captured layer as a stand-in (tests only)",
    )
    p.add_argument("--min-len", type=int, default=None, help="skip samples shorter than this")
    p.add_argument("--max-len", type=int, default=None, help="skip samples longer than this")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an export made with other arguments at DEST",
    )
    p.add_argument(
        "--allow-dry",
        action="store_true",
        help="export a dataset of engine=dry too (its rows are not hidden states: tests only)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="export a partial dataset (an interrupted run's: fewer samples than it planned); "
        'hsdump_export.json records "complete": false and the counts',
    )
    p.add_argument(
        "--workers",
        type=int,
        default=8,
        help="samples written at once (default 8; memory is about 2 x this many samples)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="write the hidden states in this dtype (default: as stored); SpecForge feeds its "
        "records to the drafter as they are, so a float32 drafter (the CPU's) needs float32",
    )
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        c = export(
            a.out,
            a.dest,
            a.to,
            final_state=a.final_state,
            min_len=a.min_len,
            max_len=a.max_len,
            overwrite=a.overwrite,
            progress=not a.no_progress,
            allow_dry=a.allow_dry,
            workers=a.workers,
            kind=a.kind,
            allow_partial=a.allow_partial,
            dtype=a.dtype,
        )
    except (Refusal, OSError) as e:  # bad input (ExportError is a Refusal), the paths named
        print(f"{prog('export')}: {e}", file=sys.stderr)
        return 2
    print(
        f"exported to {a.dest} ({a.to}, {a.kind}): {c['written']} samples written "
        f"({c['bytes'] / 2**20:,.1f} MiB), {c['skipped']} already there"
    )
    if a.to in EXPORT_KINDS:
        state = read_json_object(Path(a.dest) / STATE)
        ids = state.get("serving_ids")
        print(
            f"layers {state['kind_layers']} (hf_hidden_states_index); SGLang serving ids "
            + (
                f"{ids}: put them in the drafter's config.json as {state['serving_ids_key']}"
                if ids is not None
                else f"unknown for {state.get('serving_class')}: " + no_ids_reason(a.out, a.kind)
            )
        )
    return 0
