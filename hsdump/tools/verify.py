"""`python -m hsdump verify OUT [--retokenize] [--quick] [--complete] [--json]`: check a dataset.

Checks, against docs/format.md (versions 1 and 2):
- `manifest.json` exists and parses; the commit records (version 2: `index.json` and the logs
  in `commits/`; version 1: `index.json`) parse, agree with the manifest, list every sample
  once and every shard once, and every sample points to a listed shard;
- every listed shard exists with the recorded byte size and sha256 (streamed; `--quick`
  skips hashing), its safetensors header parses and its `__metadata__` names the manifest's
  format, format_version and layers;
- every committed sample has `{i}/input_ids`, `{i}/loss_mask` (int64, `[seq]`) and
  `{i}/hidden_states/{j}` for j < K (storage dtype, `[seq, hidden_size]`) in its shard, with
  finite hidden states and a 0/1 loss mask; no sample's tensors appear in a second shard.
  Extensions the reader knows are checked too when present: fp8 storage (`hsdump.store.fp8`:
  float8_e4m3fn hidden states with a finite, positive float32 `/scale` per token) and
  final-layer states `{i}/final/{pre_norm,post_norm}` (the same set in every sample);
- shard files no record lists, and a torn last record of a log, are reported as information
  (garbage from an interrupted run, never read), not as problems;
- `--retokenize`: the source rows, re-tokenized with the manifest's recorded config, give
  the stored `input_ids` and `loss_mask` exactly;
- a dataset holding fewer samples (committed or refused) than its run planned (manifest
  `planned`) is partial: valid, and said ("PARTIAL: N of M ... resume with the same command").

Memory stays bounded: one tensor is loaded at a time through `safe_open`.
Exit status: 0 clean (a clean partial dataset too, unless `--complete`), 1 on any problem,
2 on a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from hsdump.errors import Refusal
from hsdump.store import commits
from hsdump.store.files import UnsafeFile, read_json_object, real_file
from hsdump.store.layout import (
    DRY,
    FINAL_KINDS,
    INDEX,
    KEY_RE,
    KNOWN_FILES,
    LOG_DIR,
    LOG_SUFFIX,
    MANIFEST,
    MANIFEST_LIMIT,
    SHARD_DIR,
    SHARD_V1_RE,
    ST_CODE,
    STORAGE,
    SUPPORTED_VERSIONS,
    TMP_RE,
    read_header,
    sha256_file,
)
from hsdump.store.manifest import FP8_NAMES, problems, progress

UNLISTED = "unlisted (ignored, garbage from an interrupted run)"
LISTED = 1000
"""Problems listed one by one; more are counted (a hostile folder cannot flood the report)."""
ABSENT_LISTED = 20
"""Samples of one shard reported one by one as absent from it; more make one problem."""


def _fp8():
    """hsdump.store.fp8, imported when first needed: it imports torch, which a folder that is no
    dataset never needs (reported in a fraction of a second)."""
    from hsdump.store import fp8

    return fp8


def _short(x, n: int = 80) -> str:
    """A value from the dataset, shortened for a message."""
    t = repr(x)
    return t if len(t) <= n else t[:n] + f"... ({len(t):,} characters)"


@dataclass
class Problem:
    where: str
    """What is wrong: `manifest.json`, `index.json`, a commit log (`commits/main.jsonl byte
    120`), a shard path, `sample 12`, or `shards/main/0000/main-000003.safetensors:
    12/hidden_states/1`. "The index" in messages is the commit records: index.json and the
    logs (version 2), or index.json alone (version 1)."""
    what: str

    def line(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class Report:
    path: str
    problems: List[Problem] = field(default_factory=list)
    info: List[Problem] = field(default_factory=list)
    samples_listed: int = 0
    samples_checked: int = 0
    """Samples whose tensors were found in their shard and checked."""
    samples_ok: int = 0
    """Checked samples with no problem."""
    samples_retokenized: int = 0
    shards: int = 0
    bytes: int = 0
    """Bytes of the listed shard files found on disk."""
    bytes_hashed: int = 0
    quick: bool = False
    retokenize: bool = False
    unlisted_problems: int = 0
    """Problems found beyond the first LISTED (counted, not listed)."""
    progress: Optional[Dict[str, object]] = None
    """How far the run that writes it is (hsdump.store.manifest.Progress.to_dict): committed,
    refused and planned samples, complete (None when the manifest does not say)."""
    partial_line: str = ""
    complete: bool = False
    """--complete: a partial dataset fails too."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def passed(self) -> bool:
        """The verdict (exit 0): no problem, and not partial where --complete asks for all."""
        return self.ok and not (self.complete and self.partial)

    def problem(self, where: str, what: str) -> None:
        if len(self.problems) < LISTED:
            self.problems.append(Problem(where, what))
        else:
            self.unlisted_problems += 1

    def note(self, where: str, what: str) -> None:
        self.info.append(Problem(where, what))

    def summary(self) -> str:
        verdict = "OK" if self.passed else "FAILED"
        if self.ok and not self.passed:
            verdict = "FAILED (--complete: the dataset is partial)"
        extra = []
        if self.quick:
            extra.append("sha256 not checked: --quick")
        if self.retokenize:
            extra.append(f"{self.samples_retokenized} re-tokenized")
        return (
            f"{verdict}: {self.samples_checked} of {self.samples_listed} samples checked "
            f"({self.samples_ok} clean{', ' if extra else ''}{', '.join(extra)}), "
            f"{self.shards} shards, {self.bytes:,} bytes, "
            f"{len(self.problems) + self.unlisted_problems} problems"
        )

    def lines(self) -> List[str]:
        out = [f"verifying {self.path}"]
        out += [f"PROBLEM {p.line()}" for p in self.problems]
        if self.unlisted_problems:
            out.append(f"PROBLEM ... and {self.unlisted_problems:,} more not listed")
        out += [f"info    {p.line()}" for p in self.info]
        out.append(self.summary())
        if self.partial_line:
            out.append(self.partial_line.replace("partial:", "PARTIAL:", 1))
        return out

    @property
    def partial(self) -> bool:
        """The dataset holds fewer samples than its run planned (valid, not finished)."""
        return bool(self.progress) and self.progress.get("complete") is False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["passed"] = self.passed
        d["summary"] = self.summary()
        return d


# --------------------------------------------------------------------------- helpers
def _load_json(path: Path, report: Report) -> Optional[dict]:
    if not os.path.lexists(path):
        report.problem(path.name, "missing")
        return None
    try:
        return read_json_object(path, path.parent, MANIFEST_LIMIT)
    except UnsafeFile as e:
        report.problem(path.name, str(e))
    except (OSError, ValueError) as e:
        report.problem(path.name, f"is unusable: {e}")
    return None


def _first_diff(a: List[int], b: List[int]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"at position {i} (stored {x}, fresh {y})"
    return f"in length (stored {len(a)}, fresh {len(b)})"


# --------------------------------------------------------------------------- checks
def _check_manifest(m: dict, r: Report) -> Tuple[Optional[List[int]], Optional[int], Optional[str]]:
    """(layers, hidden_size, safetensors storage dtype) from the manifest, None where unusable;
    its problems are the reader's (hsdump.store.manifest.problems, the one validator)."""
    bad = problems(m)
    for p in bad:
        r.problem(MANIFEST, p)
    layers = None if any(p.startswith("layers ") for p in bad) else m["layers"]
    if layers is None:
        r.note(MANIFEST, "samples are not checked against its layers")
    hidden = None if any(p.startswith("model") for p in bad) else m["model"]["hidden_size"]
    sd = m.get("storage_dtype")
    st = None
    if not any(p.startswith("storage_dtype ") for p in bad):
        st = ST_CODE[STORAGE["fp8"]] if sd in FP8_NAMES else ST_CODE[STORAGE.get(sd, sd)]
    return layers, hidden, st


def _check_index(idx: dict, m: dict, r: Report) -> Tuple[Dict[str, dict], Dict[int, str]]:
    """(shards, samples) from the index, keeping only well-formed entries."""
    for key in ("format", "format_version", "layers"):
        if key in idx and idx.get(key) != m.get(key):
            r.problem(INDEX, f"{key} is {idx.get(key)!r} but manifest.json says {m.get(key)!r}")
    for key in ("format", "format_version"):
        if key not in idx:
            r.problem(INDEX, f"has no {key}")
    shards: Dict[str, dict] = {}
    raw_shards = idx.get("shards")
    if not isinstance(raw_shards, dict):
        r.problem(INDEX, "has no shards object")
        raw_shards = {}
    for name, meta in raw_shards.items():
        if (
            os.path.basename(name) != name
            or name in ("", ".", "..")
            or not name.endswith(".safetensors")
        ):
            r.problem(
                INDEX, f"shard name {name!r} is not a .safetensors file name in the dataset folder"
            )
            continue
        if not isinstance(meta, dict):
            r.problem(name, f"index entry is {meta!r}, not an object")
            continue
        for k, typ in (("bytes", int), ("samples", int), ("sha256", str)):
            if not isinstance(meta.get(k), typ):
                r.problem(name, f"index entry has no valid {k} ({meta.get(k)!r})")
        shards[name] = meta
    samples: Dict[int, str] = {}
    raw_samples = idx.get("samples")
    if not isinstance(raw_samples, dict):
        r.problem(INDEX, "has no samples object")
        raw_samples = {}
    for sid, name in raw_samples.items():
        if not (isinstance(sid, str) and sid.isdigit() and str(int(sid)) == sid):
            r.problem(INDEX, f"sample id {sid!r} is not a non-negative integer")
            continue
        if name not in raw_shards:
            r.problem(
                f"sample {sid}",
                f"index.json places it in {name!r}, which index.json "
                "does not list among its shards",
            )
            continue
        if name in shards:
            samples[int(sid)] = name
    skipped = idx.get("skipped") or {}
    if isinstance(skipped, dict):
        for sid in sorted(set(skipped) & set(raw_samples), key=lambda s: (len(s), s)):
            r.problem(
                f"sample {sid}", f"listed both as committed and as skipped ({skipped[sid]!r})"
            )
    per_shard: Dict[str, int] = {}
    for name in samples.values():
        per_shard[name] = per_shard.get(name, 0) + 1
    for name, meta in shards.items():
        want = meta.get("samples")
        if isinstance(want, int) and want != per_shard.get(name, 0):
            r.problem(
                name,
                f"index.json records {want} samples for it but places "
                f"{per_shard.get(name, 0)} samples in it",
            )
    return shards, samples


def _check_shard_file(d: Path, name: str, meta: dict, quick: bool, r: Report) -> bool:
    """Existence, size, sha256. False if the file is absent or not one hsdump reads."""
    p = d / name
    try:
        size = os.stat(real_file(p, d)).st_size
    except FileNotFoundError:
        r.problem(name, "missing: listed in the index but not on disk")
        return False
    except (OSError, ValueError) as e:
        r.problem(name, str(e))
        return False
    r.bytes += size
    if isinstance(meta.get("bytes"), int) and size != meta["bytes"]:
        kind = "truncated" if size < meta["bytes"] else "too long"
        r.problem(name, f"size {size} bytes, the index records {meta['bytes']} ({kind})")
    if not quick and isinstance(meta.get("sha256"), str):
        digest = sha256_file(p, root=d)
        r.bytes_hashed += size
        if digest != meta["sha256"]:
            r.problem(name, f"sha256 mismatch: file {digest}, the index {meta['sha256']}")
    return True


def _check_metadata(name: str, header: dict, m: dict, layers, r: Report) -> None:
    md = header.get("__metadata__")
    if not isinstance(md, dict):
        r.problem(name, "safetensors header has no __metadata__")
        return
    if md.get("format") != m.get("format"):
        r.problem(
            name,
            f"__metadata__ format is {_short(md.get('format'))}, manifest.json "
            f"says {_short(m.get('format'))}",
        )
    # a version 1 dataset resumed as version 2 keeps its version 1 shards (same layout)
    mv = m.get("format_version") if m.get("format_version") in SUPPORTED_VERSIONS else 0
    known = [str(v) for v in SUPPORTED_VERSIONS if v <= mv]
    if md.get("format_version") not in known:
        r.problem(
            name,
            f"__metadata__ format_version is {_short(md.get('format_version'))}, "
            f"manifest.json says {_short(m.get('format_version'))}",
        )
    try:
        got = json.loads(md["layers"]) if "layers" in md else None
    except (ValueError, RecursionError):
        got = md.get("layers")
    if got != m.get("layers"):
        r.problem(
            name,
            f"__metadata__ layers is {_short(md.get('layers'))}, manifest.json "
            f"says {_short(m.get('layers'))}",
        )
    if "storage_dtype" in md and (md["storage_dtype"] in _fp8().STORAGE_ALIASES) != (
        m.get("storage_dtype") in _fp8().STORAGE_ALIASES
    ):
        r.problem(
            name,
            f"__metadata__ storage_dtype is {_short(md['storage_dtype'])}, "
            f"manifest.json says {_short(m.get('storage_dtype'))}",
        )
    if "conversations" in md:
        try:
            convs = json.loads(md["conversations"])
            if not isinstance(convs, dict) or not all(
                isinstance(v, list) and all(isinstance(x, dict) for x in v) for v in convs.values()
            ):
                raise Refusal("not an object of message lists")
            strays = sorted(k for k in convs if f"{k}/input_ids" not in header)
            if strays:
                r.problem(
                    name,
                    f"__metadata__ conversations name samples "
                    f"{_short(strays[:5])} that the shard does not hold",
                )
        except (ValueError, RecursionError) as e:
            r.problem(name, f"__metadata__ conversations is unusable: {e}")
    if "convention" in md and "convention" in m and md["convention"] != m["convention"]:
        r.problem(
            name,
            f"__metadata__ convention is {_short(md['convention'])}, manifest.json "
            f"says {_short(m['convention'])}",
        )


class _Expect:
    """What every sample must hold, from the manifest."""

    def __init__(
        self, k: Optional[int], hidden: Optional[int], hidden_dtype: Optional[str], fp8_on: bool
    ):
        self.k, self.hidden, self.hidden_dtype, self.fp8 = k, hidden, hidden_dtype, fp8_on
        self.finals: Optional[Tuple[frozenset, int]] = None  # (final kinds, first sample)
        self.masked: Dict[int, int] = {}  # loss-masked counts the commit records give

    def tensors(self, sid: int, header: dict) -> List[Tuple[str, Optional[str], str, bool]]:
        """(name, safetensors dtype, role, required) for sample `sid`; role is one of
        ids, mask, hidden, scale. Final-layer states are optional (a dataset holds those it
        captured), the rest required."""
        out = [(f"{sid}/input_ids", "I64", "ids", True), (f"{sid}/loss_mask", "I64", "mask", True)]
        hidden = [(f"{sid}/hidden_states/{j}", True) for j in range(self.k or 0)]
        hidden += [
            (f"{sid}/final/{kind}", False)
            for kind in FINAL_KINDS
            if f"{sid}/final/{kind}" in header
        ]
        for name, required in hidden:
            out.append((name, self.hidden_dtype, "hidden", required))
            if self.fp8:
                out.append((name + _fp8().SCALE_SUFFIX, "F32", "scale", required))
        return out


def _scan_keys(name: str, header: dict, owner_of, ex: _Expect, r: Report) -> None:
    """Every tensor in a listed shard belongs to a sample that the index places here."""
    seen: Set[int] = set()
    for key in header:
        if key == "__metadata__":
            continue
        mt = KEY_RE.match(key)
        if mt is None:
            r.problem(
                name,
                f"tensor {_short(key)} is not named {{id}}/input_ids, "
                "{id}/loss_mask, {id}/hidden_states/{j} or "
                "{id}/final/{pre_norm|post_norm}",
            )
            continue
        j = mt.group("j")
        if j is not None and ex.k is not None and int(j) >= ex.k:
            r.problem(
                name,
                f"tensor {key!r}: only {ex.k} layers are captured (hidden_states/0..{ex.k - 1})",
            )
        if mt.group("scale") and not ex.fp8:
            r.problem(
                name,
                f"tensor {key!r}: a scale, but manifest.json stores hidden states "
                "unscaled (storage_dtype is not fp8)",
            )
        sid = commits.id_value(mt.group("sid"))
        if sid is None:
            r.problem(name, f"tensor {_short(key)}: its sample id is not an int64 >= 0")
            continue
        seen.add(sid)
    for sid in sorted(seen):
        owner = owner_of(sid)
        if owner == name:
            continue
        if owner is None:
            r.problem(name, f"holds tensors of sample {sid}, which the index does not list")
        else:
            r.problem(
                name,
                f"holds tensors of sample {sid}, which the index places in "
                f"{owner} (duplicate sample in two shards)",
            )


def _check_samples(
    d: Path, name: str, header: dict, sids: List[int], ex: _Expect, fresh, r: Report
) -> None:
    import torch
    from safetensors import safe_open

    try:
        f = safe_open(real_file(d / name, d), framework="pt")
    except Exception as e:  # noqa: BLE001 - any failure here is a report line
        r.problem(name, f"safetensors cannot open it ({e}); its {len(sids)} samples are unchecked")
        return
    for sid in sids:
        where = f"{name}: sample {sid}"
        expect = ex.tensors(sid, header)
        absent = {key for key, _, _, required in expect if required and key not in header}
        if len(absent) == sum(1 for e in expect if e[3]):
            r.problem(
                where,
                "absent from its shard: the index lists it but the shard holds none of its tensors",
            )
            continue
        r.samples_checked += 1
        for key, _, _, _ in expect:
            if key in absent:
                r.problem(f"{name}: {key}", "missing")
        ok = not absent
        finals = frozenset(k for k in FINAL_KINDS if f"{sid}/final/{k}" in header)
        if ex.finals is None:
            ex.finals = (finals, sid)
        elif finals != ex.finals[0]:
            r.problem(
                where,
                f"has final-layer states {sorted(finals)}, but sample "
                f"{ex.finals[1]} has {sorted(ex.finals[0])}",
            )
            ok = False
        # header: dtypes and shapes
        seq = None
        present = [e for e in expect if e[0] not in absent]
        for key, dtype, role, _ in present:
            t = header[key]
            shape = t.get("shape")
            ndim = 2 if role == "hidden" else 1
            if dtype is not None and t.get("dtype") != dtype:
                r.problem(f"{name}: {key}", f"dtype {t.get('dtype')}, expected {dtype}")
                ok = False
            if not isinstance(shape, list) or len(shape) != ndim:
                r.problem(
                    f"{name}: {key}",
                    f"shape {shape}, expected {'[seq, hidden_size]' if ndim == 2 else '[seq]'}",
                )
                ok = False
                continue
            if seq is None:
                seq = shape[0]
            elif shape[0] != seq:
                r.problem(f"{name}: {key}", f"length {shape[0]}, but {sid}/input_ids has {seq}")
                ok = False
            if ndim == 2 and ex.hidden is not None and shape[1] != ex.hidden:
                r.problem(f"{name}: {key}", f"shape {shape}, but hidden_size is {ex.hidden}")
                ok = False
        if seq == 0:
            r.problem(where, "is empty (seq = 0)")
            ok = False
        # values, one tensor at a time
        stored_ids = stored_mask = None
        for key, dtype, role, _ in present:
            try:
                x = f.get_tensor(key)
            except Exception as e:  # noqa: BLE001
                r.problem(f"{name}: {key}", f"cannot be read: {e}")
                ok = False
                continue
            bad = None
            if role == "ids":
                if x.dtype == torch.int64 and bool((x < 0).any()):
                    r.problem(f"{name}: {key}", "holds negative token ids")
                    ok = False
                stored_ids = x.tolist() if fresh is not None else None
            elif role == "mask":
                bad = ~((x == 0) | (x == 1))
                if bool(bad.any()):
                    pos = int(bad.flatten().nonzero()[0])
                    val = x.flatten()[pos].item()
                    r.problem(
                        f"{name}: {key}",
                        f"values outside {{0, 1}} (first at position {pos}: {val})",
                    )
                    ok = False
                stored_mask = x.tolist() if fresh is not None else None
                want = ex.masked.get(sid)
                got = int(x.sum()) if want is not None else None
                if got != want:
                    r.problem(
                        f"{name}: {key}", f"{got} loss-masked tokens, the commit record says {want}"
                    )
                    ok = False
            elif x.is_floating_point():
                if x.element_size() == 1:  # fp8: torch has no isfinite for it
                    x = x.float()
                bad = ~torch.isfinite(x)
                if role == "scale":
                    bad |= x <= 0
                if bool(bad.any()):
                    first = bad.nonzero()[0]
                    what = (
                        "non-finite or non-positive scales"
                        if role == "scale"
                        else "non-finite values (NaN/Inf)"
                    )
                    r.problem(
                        f"{name}: {key}", f"{int(bad.sum())} {what}, first in row {int(first[0])}"
                    )
                    ok = False
            del x, bad
        if ok:
            r.samples_ok += 1
        if fresh is not None and stored_ids is not None and stored_mask is not None:
            _compare_fresh(sid, stored_ids, stored_mask, fresh, r)


def _compare_fresh(sid: int, ids: List[int], mask: List[int], fresh, r: Report) -> None:
    data, pos, skipped_reason = fresh
    where = f"sample {sid}"
    if sid not in pos:
        r.problem(
            where, f"--retokenize: its source row gives no sample now ({skipped_reason(sid)})"
        )
        return
    i = pos[sid]
    good = True
    if ids != list(data.input_ids[i]):
        r.problem(
            where,
            "--retokenize: input_ids differ from a fresh tokenization of row "
            f"{sid} {_first_diff(ids, list(data.input_ids[i]))}",
        )
        good = False
    if mask != list(data.loss_mask[i]):
        r.problem(
            where,
            "--retokenize: loss_mask differs from a fresh tokenization of row "
            f"{sid} {_first_diff(mask, list(data.loss_mask[i]))}",
        )
        good = False
    if good:
        r.samples_retokenized += 1


def _note_fingerprint(m: dict, dcfg, rows, r: Report) -> None:
    """--retokenize: a note when the source's rows are not the ones the manifest records. The
    manifest's `dataset.fingerprint` is hsdump.corpus.sources.content_fingerprint, as extract
    computed it (the rows' content, not their path or how they were loaded)."""
    from hsdump.corpus.sources import content_fingerprint

    fp = (m.get("dataset") or {}).get("fingerprint")
    if not fp or fp == "unknown":
        return
    if not str(fp).startswith("sha256:"):
        r.note(
            MANIFEST,
            f"--retokenize: the manifest's dataset fingerprint {fp} is of an older hsdump (how "
            "the file was loaded, not its content) and is not compared; comparing tokens",
        )
        return
    now = content_fingerprint(dcfg, rows)
    if now != fp:
        r.note(
            MANIFEST,
            "--retokenize: the source dataset's content is not the recorded one (the file was "
            f"edited, or it is another file): its fingerprint is now {now} (manifest: {fp}); "
            "comparing tokens anyway",
        )


def _retokenize(m: dict, r: Report):
    """Fresh (input_ids, loss_mask) of the manifest's source rows, or None on failure."""
    if not isinstance(m.get("config"), dict):
        r.problem(MANIFEST, "--retokenize: has no config object to re-load the dataset from")
        return None
    try:
        from hsdump.config import to_config
        from hsdump.corpus import tokenizer
        from hsdump.corpus.chat import template_sha256
        from hsdump.corpus.sources import load_rows
        from hsdump.corpus.tokenization import tokenize_dataset
        from hsdump.tiny import resolve_model_path

        cfg = to_config(m["config"])
        model_path = resolve_model_path(cfg.model.path)
        tok = tokenizer.load_tokenizer(cfg.model, model_path)
        want = (m.get("tokenizer") or {}).get("chat_template_sha256")
        if want and template_sha256(tok) != want:
            r.problem(
                MANIFEST,
                f"--retokenize: the chat template loaded now has sha256 "
                f"{template_sha256(tok)}, the manifest records {want}",
            )
        dcfg = cfg.dataset
        if getattr(dcfg, "cache", False):  # a fresh tokenization, not a cached one
            dcfg = dataclasses.replace(dcfg, cache=False)
        if dcfg.max_seq_len is None and isinstance(m.get("max_seq_len"), int):
            # the recorded config leaves it to the model's context: the run's resolved value
            dcfg = dataclasses.replace(dcfg, max_seq_len=m["max_seq_len"])
        rows = load_rows(dcfg)
        kw = (
            {"progress": False}
            if "progress" in inspect.signature(tokenize_dataset).parameters
            else {}
        )
        data = tokenize_dataset(rows, tok, dcfg, **kw)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        r.problem(
            MANIFEST,
            f"--retokenize: cannot re-tokenize the source dataset: {type(e).__name__}: {e}",
        )
        return None
    _note_fingerprint(m, dcfg, rows, r)
    pos = {sid: i for i, sid in enumerate(data.ids)}
    n_rows = len(rows)

    def skipped_reason(sid: int) -> str:
        if sid >= n_rows:
            return f"the source has only {n_rows} rows"
        return "the row is skipped by the recorded config"

    return data, pos, skipped_reason


def _note_unlisted(d: Path, shards, c: "commits.Commits", r: Report) -> None:
    for p in sorted(d.iterdir()):
        n = p.name
        if n in KNOWN_FILES or n in shards:
            continue
        if SHARD_V1_RE.match(n) or TMP_RE.match(n):
            r.note(n, UNLISTED)
        else:
            r.note(n, "not part of an hsdump dataset (ignored)")
    top = d / SHARD_DIR
    if top.is_dir():
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(root, f), d).replace(os.sep, "/")
                if rel not in shards:
                    r.note(rel, UNLISTED)
    logs = d / LOG_DIR
    if logs.is_dir():
        for p in sorted(logs.iterdir()):
            if not p.name.endswith(LOG_SUFFIX):
                r.note(f"{LOG_DIR}/{p.name}", "not a commit log (ignored)")
    for name, n in sorted(c.torn.items()):
        r.note(
            f"{LOG_DIR}/{name}{LOG_SUFFIX}",
            f"a torn last record of {n} bytes (a crash "
            f"during a commit; ignored, and cut when that "
            f"writer resumes)",
        )


def _check_records(d: Path, m: dict, c: "commits.Commits", r: Report) -> None:
    """Version 2: index.json agrees with the manifest; the records' problems reported (and
    an index.json the readers ignore)."""
    idx, _ = commits.read_index(d)  # one that does not read is in c.notes
    for key in ("format", "format_version"):
        if idx is not None and idx.get(key) != m.get(key):
            r.problem(
                INDEX,
                f"{key} is {_short(idx.get(key))} but manifest.json says {_short(m.get(key))}",
            )
    for where, what in c.notes + c.problems:
        r.problem(where, what)


# --------------------------------------------------------------------------- entry points
def verify(path, retokenize: bool = False, quick: bool = False, complete: bool = False) -> Report:
    """Check the dataset at `path`; the Report lists every problem found (none: valid), and
    with `complete` its verdict (`passed`) fails a partial dataset too."""
    d = Path(path)
    r = Report(path=str(path), quick=quick, retokenize=retokenize, complete=complete)
    if not d.is_dir():
        r.problem(str(path), "is not a directory")
        return r
    m = _load_json(d / MANIFEST, r)
    if m is None:
        return r
    try:
        c = commits.load(d)
    except (OSError, ValueError) as e:
        r.problem("commit records", str(e))
        return r
    if isinstance(m, dict):
        pg = progress(m, len(c), c.refused())
        r.progress, r.partial_line = pg.to_dict(), pg.line()
    if not c.names and not c.skipped and not c.problems:
        r.problem(
            INDEX, "no shard was ever committed to this dataset (no index.json, no commit record)"
        )
        return r
    layers, hidden, st_dtype = _check_manifest(m, r)
    if m.get("engine") == DRY:
        r.note(
            MANIFEST,
            "engine=dry: the rows are a function of the token ids, not hidden states "
            "(export and the loader refuse this dataset unless asked)",
        )
    if c.version == 1:
        idx = _load_json(d / INDEX, r)
        if idx is None:
            return r
        shards, samples = _check_index(idx, m, r)
        by_shard: Dict[str, List[int]] = {}
        for sid, name in samples.items():
            by_shard.setdefault(name, []).append(sid)
        entries = (
            (name, shards[name], sorted(by_shard.get(name, [])), (), ()) for name in sorted(shards)
        )
        owner, listed, names = samples.get, len(samples), set(shards)
    else:
        _check_records(d, m, c, r)
        entries, owner = _entries(c)
        listed, names = len(c), set(c.names)
    r.samples_listed = listed
    _note_unlisted(d, names, c, r)
    fresh = _retokenize(m, r) if retokenize else None

    ex = _Expect(
        len(layers) if layers else None,
        hidden,
        st_dtype,
        m.get("storage_dtype") in _fp8().STORAGE_ALIASES,
    )
    # one shard at a time: what is held is the commit records' columns and one shard's header
    for name, meta, sids, lengths, masked in entries:
        r.shards += 1
        if not _check_shard_file(d, name, meta, quick, r):
            if sids:
                r.problem(name, f"its {len(sids)} samples ({_id_list(sids)}) cannot be read")
            continue
        try:
            header, _ = read_header(d / name, d)
        except (OSError, ValueError) as e:
            r.problem(
                name, f"safetensors header is unusable: {e}; its {len(sids)} samples are unchecked"
            )
            continue
        _check_metadata(name, header, m, layers, r)
        for sid, n in zip(sids, lengths):
            got = (header.get(f"{sid}/input_ids") or {}).get("shape")
            if got is not None and got != [n]:
                r.problem(
                    f"{name}: sample {sid}", f"commit record says {n} tokens, the shard holds {got}"
                )
        ex.masked = dict(zip(sids, masked))
        _scan_keys(name, header, owner, ex, r)
        absent = [sid for sid in sids if f"{sid}/input_ids" not in header]
        if len(absent) > ABSENT_LISTED:  # one line, not one per sample
            r.problem(
                name,
                f"the index lists {len(absent):,} samples whose tensors the shard "
                f"does not hold ({_id_list(absent)})",
            )
            gone = set(absent)
            sids = [sid for sid in sids if sid not in gone]
        if ex.k is not None:
            _check_samples(d, name, header, sids, ex, fresh, r)
    return r


def _entries(c: "commits.Commits"):
    """Version 2: (shard entries in name order, sample id -> owning shard lookup), from the
    records' columns (no per-sample dict: 1M samples stay a few arrays)."""
    sids, shard, _, _ = c.arrays()
    owner = commits.IdTable(sids, shard, c.names).get

    def gen():
        for k in sorted(range(len(c.names)), key=c.names.__getitem__):
            name, a, b = c.names[k], c.starts[k], c.starts[k + 1]
            rows = [
                (i, n, mk)
                for i, n, mk in zip(c.ids[a:b], c.lens[a:b], c.masked_counts[a:b])
                if c.first is None or owner(i) == name
            ]  # a repeat is checked where first
            rows.sort()
            yield (
                name,
                {"bytes": c.nbytes[k], "sha256": c.sha256[k]},
                [x[0] for x in rows],
                [x[1] for x in rows],
                [x[2] for x in rows],
            )

    return gen(), owner


def _id_list(ids: List[int], n: int = 8) -> str:
    s = ", ".join(str(i) for i in ids[:n])
    return s + (f", ... {len(ids) - n} more" if len(ids) > n else "")


def main(argv=None) -> int:
    from hsdump.command import prog

    ap = argparse.ArgumentParser(
        prog=prog("verify"),
        description="Check an hsdump dataset: manifest and index agree, every listed shard "
        "has its recorded size and sha256 and a valid header, every sample's "
        "tensors exist with the right dtypes, shapes and finite values, no sample "
        "is in two shards; says when the dataset is partial (fewer samples than its run "
        "planned). Exit 0 when clean (a clean partial dataset too, unless --complete), 1 on any "
        "problem, 2 on usage errors.",
    )
    ap.add_argument("out", metavar="OUT", help="dataset directory (holds manifest.json)")
    ap.add_argument(
        "--retokenize",
        action="store_true",
        help="re-load the source dataset and tokenizer from the manifest's config "
        "and compare every sample's input_ids and loss_mask",
    )
    ap.add_argument("--quick", action="store_true", help="skip the sha256 of each shard")
    ap.add_argument(
        "--complete",
        action="store_true",
        help="also fail (exit 1) when the dataset is partial: fewer samples than its run "
        "planned (an interrupted run; the same command resumes it)",
    )
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse: 0 for --help, 2 for usage errors
        return int(e.code or 0)
    if not os.path.isdir(args.out):
        print(f"{prog('verify')}: {args.out}: no such directory", file=sys.stderr)
        return 2
    report = verify(args.out, retokenize=args.retokenize, quick=args.quick, complete=args.complete)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print("\n".join(report.lines()))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
