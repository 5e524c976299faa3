"""Read an hsdump dataset for training: speculators v1 records by sample id, memory-mapped.

Only the commit records (index.json and the logs in commits/, see hsdump.store.commits) decide
what is in the dataset; shard files they do not list are never opened. No sglang or Hydra import here: trainers can use this module alone.

    ds = HsdumpDataset("OUT", max_len=4096)      # optional length filter (header-only)
    rec = ds.get(17)                              # by sample id
    rec = ds[0]                                   # i-th sample in id order
    loader = DataLoader(ds, batch_size=8, collate_fn=PadCollator(), num_workers=4)

Tensors come from `safetensors.safe_open(..., framework="pt")`, whose `get_tensor` maps the
tensor's byte range of the shard file (MAP_PRIVATE) instead of reading it: `get` costs a
header lookup and an mmap, and pages are read from disk (or the page cache) only when the
tensor is used. Hidden states stored in fp8 (see `hsdump.store.fp8`) are dequantized on `get`, which
does read them; everything else is returned as stored, without a copy.
"""

from __future__ import annotations

import copy
import os
import threading
import warnings
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

import torch
from safetensors import safe_open

from hsdump.errors import Refusal
from hsdump.store import commits, fp8
from hsdump.store.commits import IdTable
from hsdump.store.files import open_inside, parse_json, real_file
from hsdump.store.layout import (
    FINAL_KINDS,
    LAST_LAYER,
    TORCH_NAME,
    check_not_dry,
    final_name,
    read_header,
    torch_dtype,
)
from hsdump.store.manifest import Progress, check_manifest, progress

_OPEN_LOCK = threading.Lock()


def read_safetensors_header(path, root=None) -> dict:
    """The JSON header of a safetensors file (tensor dtypes, shapes, offsets, `__metadata__`),
    read with two small reads and checked (hsdump.store.layout.read_header: every tensor inside the
    file); no tensor data is touched. `__data_start__` is added: the file offset that
    `data_offsets` count from."""
    header, start = read_header(path, root)
    header["__data_start__"] = start  # where tensor data_offsets count from
    return header


def _damaged(root, where: str, what: str) -> Refusal:
    """The error for a damaged file of dataset `root` (`where`: the file, relative to it): the
    dataset named is not one hsdump can read, and the message says how to see every problem."""
    return Refusal(f"{Path(root) / where}: {what}; run `hsdump verify {root}` for every problem")


class HsdumpDataset(torch.utils.data.Dataset):
    """`ds[i]` is the i-th sample in id order; `ds.get(sample_id)` looks one up by id.

    A record is `{"id", "input_ids": int64[seq], "loss_mask": int64[seq],
    "hidden_states": [K tensors [seq, H]]}` with `hidden_states[j]` at capture index
    `ds.layers[j]`, plus `"final": {"pre_norm"|"post_norm": [seq, H]}` when the dataset
    captured the final layer.

    `min_len` / `max_len` keep only samples whose token count lies in [min_len, max_len];
    lengths come from the shard headers, not from the tensors. `ids` restricts to those
    sample ids. `dtype` converts hidden states on `get` (a copy); by default they are returned
    as stored, and fp8-stored ones are dequantized to bfloat16. `dequantize=False` returns
    fp8-stored tensors as stored (mmap, no copy) with their per-token scales in
    `"hidden_states_scale"` (K tensors [seq] float32) and `"final_scale"`, for a trainer that
    moves fp8 to the GPU and calls `hsdump.store.fp8.dequantize` there (half the host-to-device
    bytes, and no CPU dequantize pass). `mmap=False` reads each record with pread into
    fresh memory instead of mapping the shard (one copy, freed with the record): for one
    pass over a dataset larger than memory (the exports use it), where touched mapped pages
    would otherwise stay in the process's RSS while the shard's handle is open.
    """

    def __init__(
        self,
        path: str,
        *,
        min_len: Optional[int] = None,
        max_len: Optional[int] = None,
        ids: Optional[Iterable[int]] = None,
        dtype: Optional[torch.dtype] = None,
        dequantize: bool = True,
        mmap: bool = True,
        allow_dry: bool = False,
    ):
        self.path = Path(path)
        self.dequantize = dequantize
        self.mmap = mmap
        c = commits.load(self.path)  # FileNotFoundError / ValueError name the problem
        self.manifest = commits.read_manifest(self.path)
        check_manifest(self.path, self.manifest)  # the one validator (hsdump.store.manifest)
        check_not_dry(self.path, self.manifest, allow_dry, "HsdumpDataset(..., allow_dry=True)")
        self.version = c.version
        self.commits = c
        """the commit records (hsdump.store.commits.Commits): shard names, sizes, checksums"""
        self.skipped: Dict[int, str] = c.skipped
        """sample id -> why the writer refused it"""
        self.problems = c.problems
        if c.problems:
            warnings.warn(
                f"{self.path}: {len(c.problems)} problems in its commit records, "
                f"e.g. {': '.join(c.problems[0])}; run `hsdump verify "
                f"{self.path}`",
                stacklevel=2,
            )
        for where, what in c.notes:
            warnings.warn(f"{self.path}: {where}: {what}", stacklevel=2)
        self.layers: List[int] = list(self.manifest["layers"])
        self.storage_dtype: str = str(self.manifest.get("storage_dtype", "bfloat16"))
        self.dtype = dtype
        sids, shard, lens, masked = c.arrays()
        self._shard_of = IdTable(sids, shard, c.names)
        # version 2 records carry each sample's length and loss-masked count: length filters
        # and dataset statistics need no shard header then
        self._lens = lens
        self._masked = masked
        self.ids: List[int] = sids.tolist()
        self._handles: Dict[str, object] = {}
        self._fds: Dict[str, int] = {}
        self._headers: Dict[str, dict] = {}
        self._convs: Dict[str, dict] = {}
        self._shard_pos: Optional[Dict[str, int]] = None  # shard name -> its record's index
        if ids is not None:
            wanted = set(int(i) for i in ids)
            missing = [i for i in wanted if i not in self._shard_of]
            if missing:
                raise KeyError(f"samples {sorted(missing)[:10]} are not in {self.path}")
            self.ids = [i for i in self.ids if i in wanted]
        if min_len is not None or max_len is not None:
            self.ids = self._filtered(min_len, max_len)

    # ------------------------------------------------------------------ sizes, cheaply
    def header(self, shard: str) -> dict:
        h = self._headers.get(shard)
        if h is None:
            h = read_safetensors_header(self.path / shard, self.path)
            self._check_holds(shard, h)
            self._headers[shard] = h
        return h

    def _check_holds(self, shard: str, head: dict) -> None:
        """A shard holds every sample its commit record lists (the counts checked against the
        header once, when it is first read: a record cannot promise what is not there)."""
        c = self.commits
        if self._shard_pos is None:
            self._shard_pos = {name: k for k, name in enumerate(c.names)}
        k = self._shard_pos.get(shard)
        if k is None:
            return
        missing = [i for i in c.ids[c.starts[k] : c.starts[k + 1]] if f"{i}/input_ids" not in head]
        if missing:
            raise _damaged(
                self.path,
                shard,
                f"its commit record lists {len(missing):,} "
                f"sample{'s' * (len(missing) != 1)} it does not hold (e.g. "
                f"{missing[:5]})",
            )

    def _meta(self, shard: str, name: str) -> dict:
        """Tensor `name`'s header entry in `shard`, which its commit record promises."""
        meta = self.header(shard).get(name)
        if not isinstance(meta, dict):
            raise _damaged(
                self.path, shard, f"holds no tensor {name[:80]!r}, which its commit record promises"
            )
        return meta

    def _lens_array(self):
        """Token counts aligned with the id table (version 1: read from shard headers once)."""
        if self._lens is None:
            import numpy as np

            t = self._shard_of
            self._lens = np.asarray(
                [
                    int((self._meta(t.names[k], f"{sid}/input_ids")["shape"] or [0])[0])
                    for sid, k in zip(t.sids.tolist(), t.shard.tolist())
                ],
                dtype=np.int64,
            )
        return self._lens

    def _column(self, col, ids: Sequence[int]) -> List[int]:
        if len(ids) == len(self._shard_of):
            return col.tolist()
        return col[self._shard_of.positions(ids)].tolist()

    def conversation(self, sid: int) -> Optional[list]:
        """The messages sample `sid` was made from when its answers were regenerated by the
        target model (`regenerate.turns`), from its shard's metadata; None otherwise."""
        try:
            shard = self._shard_of[sid]
        except KeyError:
            raise KeyError(f"sample {sid} is not in {self.path}") from None
        convs = self._convs.get(shard)
        if convs is None:
            raw = (self.header(shard).get("__metadata__") or {}).get("conversations")
            convs = parse_json(raw, f"{self.path / shard}: its conversations") if raw else {}
            if not isinstance(convs, dict):
                raise _damaged(self.path, shard, "its conversations metadata is not an object")
            self._convs[shard] = convs
        conv = convs.get(str(sid))
        if conv is not None and not (
            isinstance(conv, list) and all(isinstance(x, dict) for x in conv)
        ):
            raise _damaged(
                self.path, shard, f"its conversation of sample {sid} is not a list of messages"
            )
        return conv

    def masked_count(self, sid: int) -> int:
        """Loss-masked tokens of sample `sid`: from its commit record, else read its mask."""
        if self._masked is not None:
            return int(self._masked[self._shard_of.position(sid)])
        return int(self.get(sid, hidden=False)["loss_mask"].sum())

    def masked_counts(self) -> List[int]:
        """Loss-masked tokens aligned with `self.ids` (version 1: read from the masks)."""
        if self._masked is not None:
            return self._column(self._masked, self.ids)
        return [self.masked_count(sid) for sid in self.ids]

    def length(self, sid: int) -> int:
        """Token count of sample `sid`, from its commit record (or shard header)."""
        return int(self._lens_array()[self._shard_of.position(sid)])

    @property
    def lengths(self) -> List[int]:
        """Token counts aligned with `self.ids` (and `ds[i]`)."""
        return self._column(self._lens_array(), self.ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["model"]["hidden_size"])  # checked on open

    @property
    def progress(self) -> Progress:
        """How far the run that writes this dataset is: samples committed and refused of the
        planned ones (`.partial`: a run left it unfinished; the same command resumes it)."""
        return progress(self.manifest, len(self.commits), self.commits.refused())

    @property
    def final_kinds(self) -> List[str]:
        """Which final-layer states this dataset holds ([] if none was captured)."""
        if not self.ids:
            return []
        sid = self.ids[0]
        head = self.header(self._shard_of[sid])
        return [k for k in FINAL_KINDS if final_name(sid, k) in head]

    def _filtered(self, min_len, max_len) -> List[int]:
        lo = 0 if min_len is None else int(min_len)
        hi = float("inf") if max_len is None else int(max_len)
        return [s for s, n in zip(self.ids, self.lengths) if lo <= n <= hi]

    def filter(
        self,
        min_len: Optional[int] = None,
        max_len: Optional[int] = None,
        ids: Optional[Iterable[int]] = None,
    ) -> "HsdumpDataset":
        """A view of this dataset restricted by length and/or ids (shares nothing mutable)."""
        new = copy.copy(self)
        new._handles = {}
        new._fds = {}
        new._idset = None
        new.ids = list(self.ids)
        if ids is not None:
            wanted = set(int(i) for i in ids)
            new.ids = [i for i in new.ids if i in wanted]
        if min_len is not None or max_len is not None:
            new.ids = new._filtered(min_len, max_len)
        return new

    # ------------------------------------------------------------------ records
    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return self.get(self.ids[i])

    def __iter__(self) -> Iterator[dict]:
        for sid in self.ids:
            yield self.get(sid)

    def __contains__(self, sid: int) -> bool:
        if len(self.ids) == len(self._shard_of):
            return sid in self._shard_of
        if getattr(self, "_idset", None) is None or len(self._idset) != len(self.ids):
            self._idset = set(self.ids)
        return sid in self._idset

    def _open(self, shard: str):
        h = self._handles.get(shard)
        if h is None:
            self.header(shard)  # checked whole first: every tensor lies inside the file
            try:
                h = safe_open(real_file(self.path / shard, self.path), framework="pt")
            except (OSError, ValueError):
                raise
            except Exception as e:  # noqa: BLE001 - safetensors' own error type
                raise _damaged(self.path, shard, f"safetensors cannot open it ({e})") from None
            self._handles[shard] = h
        return h

    def _mapped(self, shard: str):
        """A function reading one tensor of `shard` by name, memory-mapped."""
        h = self._open(shard)

        def get(name: str) -> torch.Tensor:
            self._meta(shard, name)
            try:
                return h.get_tensor(name)
            except Exception as e:  # noqa: BLE001 - safetensors' own error type
                raise _damaged(self.path, shard, f"{name} cannot be read ({e})") from None

        return get

    def _hidden(self, get, head: dict, name: str, scales: Optional[list] = None) -> torch.Tensor:
        t = get(name)
        if t.dtype == fp8.FP8_DTYPE:
            sname = name + fp8.SCALE_SUFFIX
            if sname not in head:
                raise Refusal(f"{self.path}: {name} is stored in fp8 but {sname} is missing")
            if not self.dequantize:
                if scales is not None:
                    scales.append(get(sname))
                return t
            return fp8.dequantize(t, get(sname), self.dtype or torch.bfloat16)
        if self.dtype is not None and t.dtype != self.dtype:
            t = t.to(self.dtype)
        return t

    def _pread(self, shard: str, name: str) -> torch.Tensor:
        """One tensor by pread into fresh memory, with readahead off on this descriptor.

        Used for ids and masks alone (touching a mapped tensor makes the kernel read ahead:
        safe_open asks for sequential readahead, up to 2 x read_ahead_kb, 16 MB on a disk with
        8 MB, which would pull in the hidden states that follow) and for whole records when
        `mmap=False` (nothing stays mapped: memory is freed with the record)."""
        head = self.header(shard)
        meta = self._meta(shard, name)
        fd = self._fds.get(shard)
        if fd is None:
            with _OPEN_LOCK:  # threads share the descriptors (hsdump export --workers)
                fd = self._fds.get(shard)
                if fd is None:
                    fd = open_inside(self.path / shard, self.path)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    self._fds[shard] = fd
        begin, end = meta["data_offsets"]
        dtype = torch_dtype(meta["dtype"]) if meta["dtype"] in TORCH_NAME else None
        if dtype is None:
            raise _damaged(
                self.path, shard, f"{name} has dtype {meta['dtype']}, which hsdump does not store"
            )
        if end == begin:
            return torch.empty(meta["shape"], dtype=dtype)
        raw = os.pread(fd, end - begin, head["__data_start__"] + begin)
        if len(raw) != end - begin:
            raise _damaged(
                self.path,
                shard,
                f"{name}: the file ends before its data does "
                "(it was cut after its header was read)",
            )
        t = torch.frombuffer(bytearray(raw), dtype=dtype)
        return t.reshape(meta["shape"])

    def get(self, sid: int, *, hidden: bool = True) -> dict:
        """Sample `sid`; `hidden=False` leaves out the hidden states (ids and mask only, read
        with two small preads: cheap for whole-dataset scans such as inspect)."""
        try:
            shard = self._shard_of[sid]
        except KeyError:
            raise KeyError(f"sample {sid} is not in {self.path}") from None
        if not hidden or not self.mmap:

            def get(name):
                return self._pread(shard, name)
        else:
            get = self._mapped(shard)
        rec = {
            "id": sid,
            "input_ids": get(f"{sid}/input_ids"),
            "loss_mask": get(f"{sid}/loss_mask"),
        }
        if not hidden:
            return rec
        head = self.header(shard)
        scales: list = []
        rec["hidden_states"] = [
            self._hidden(get, head, f"{sid}/hidden_states/{j}", scales)
            for j in range(len(self.layers))
        ]
        if scales:
            rec["hidden_states_scale"] = scales
        final, fscales = {}, {}
        for k in FINAL_KINDS:
            if final_name(sid, k) in head:
                sc: list = []
                final[k] = self._hidden(get, head, final_name(sid, k), sc)
                if sc:
                    fscales[k] = sc[0]
        if final:
            rec["final"] = final
        if fscales:
            rec["final_scale"] = fscales
        return rec

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        self._handles = {}

    def __del__(self):
        try:
            for fd in self._fds.values():
                os.close(fd)
        except Exception:
            pass

    def __getstate__(self):  # DataLoader workers open their own handles
        state = dict(self.__dict__)
        state["_handles"] = {}
        state["_fds"] = {}
        return state


def open_dataset(path: str, **kw) -> HsdumpDataset:
    return HsdumpDataset(path, **kw)


# ---------------------------------------------------------------------- batching
class PadCollator:
    """Pads a list of records into a batch (picklable, for DataLoader workers).

    Returns `ids` int64 [B], `lengths` int64 [B], `input_ids` int64 [B, T] (padded with
    `pad_token_id`), `loss_mask` int64 [B, T] (0 on padding), `attention_mask` int64 [B, T]
    (1 on real tokens), `hidden_states`: K tensors [B, T, H] (zeros on padding) and, when the
    records have them, `final`: {kind: [B, T, H]}. T is the longest length in the batch,
    rounded up to `pad_to_multiple_of`; `max_len` truncates samples first.
    """

    def __init__(
        self,
        pad_token_id: int = 0,
        pad_to_multiple_of: Optional[int] = None,
        max_len: Optional[int] = None,
    ):
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_len = max_len

    def __call__(self, batch: Sequence[dict]) -> dict:
        if not batch:
            raise ValueError("empty batch")
        cut = self.max_len
        lens = [
            len(r["input_ids"]) if cut is None else min(len(r["input_ids"]), cut) for r in batch
        ]
        T = max(lens)
        m = self.pad_to_multiple_of
        if m:
            T = -(-T // m) * m
        B = len(batch)
        out = {
            "ids": torch.tensor([int(r.get("id", -1)) for r in batch], dtype=torch.int64),
            "lengths": torch.tensor(lens, dtype=torch.int64),
            "input_ids": torch.full((B, T), self.pad_token_id, dtype=torch.int64),
            "loss_mask": torch.zeros((B, T), dtype=torch.int64),
            "attention_mask": torch.zeros((B, T), dtype=torch.int64),
        }
        for b, (r, n) in enumerate(zip(batch, lens)):
            out["input_ids"][b, :n] = r["input_ids"][:n]
            out["loss_mask"][b, :n] = r["loss_mask"][:n]
            out["attention_mask"][b, :n] = 1
        out["hidden_states"] = [
            self._pad([r["hidden_states"][j] for r in batch], lens, T)
            for j in range(len(batch[0]["hidden_states"]))
        ]
        if "final" in batch[0]:
            out["final"] = {
                k: self._pad([r["final"][k] for r in batch], lens, T) for k in batch[0]["final"]
            }
        if "hidden_states_scale" in batch[0]:  # fp8 read with dequantize=False
            out["hidden_states_scale"] = [
                self._pad([r["hidden_states_scale"][j] for r in batch], lens, T)
                for j in range(len(batch[0]["hidden_states_scale"]))
            ]
        if "final_scale" in batch[0]:
            out["final_scale"] = {
                k: self._pad([r["final_scale"][k] for r in batch], lens, T)
                for k in batch[0]["final_scale"]
            }
        return out

    @staticmethod
    def _pad(ts: List[torch.Tensor], lens: List[int], T: int) -> torch.Tensor:
        first = ts[0]
        out = torch.empty((len(ts), T, *first.shape[1:]), dtype=first.dtype)
        for b, (t, n) in enumerate(zip(ts, lens)):
            out[b, :n] = t[:n]  # the one copy: page cache -> batch
            if n < T:
                out[b, n:].zero_()
        return out


def pad_collate(batch: Sequence[dict]) -> dict:
    """`PadCollator()` with its defaults (pad id 0, no rounding, no truncation)."""
    return PadCollator()(batch)


# ---------------------------------------------------------------------- speculators v1
def resolve_final_state(
    ds: HsdumpDataset, final_state: str = "auto", prefer: str = "pre_norm"
) -> Optional[str]:
    """Which tensor fills the verifier-state slot that trainers expect after the aux layers.

    `auto` takes `prefer` ("pre_norm" for speculators, whose model applies the verifier's norm
    itself; "post_norm" for SpecForge) and refuses if the dataset did not capture it.
    `pre_norm` / `post_norm` ask for that one explicitly. `last-layer` uses the last captured
    layer (`layers[-1]`, e.g. L-3) as a stand-in and warns: it is NOT the verifier's final
    state, so a drafter trained on it learns wrong targets; use it only to test plumbing.
    `none` appends nothing.
    """
    if final_state == "none":
        return None
    if final_state == LAST_LAYER:
        warnings.warn(
            f"{ds.path}: using the last captured layer (capture index "
            f"{ds.layers[-1]}) as the verifier's final state; it is not the final "
            "layer, so a drafter trained on it learns wrong targets. Capture the "
            "final layer for real training.",
            stacklevel=2,
        )
        return LAST_LAYER
    want = prefer if final_state == "auto" else final_state
    if want not in FINAL_KINDS:
        raise Refusal(
            f"final state {final_state!r}: use auto, pre_norm, post_norm, {LAST_LAYER} or none"
        )
    have = ds.final_kinds
    if want not in have:
        k = len(ds.layers)
        raise Refusal(
            f"{ds.path} holds no final-layer state {want!r} (it has: {have or 'none'}): the "
            f"trainer takes it as the verifier's final state, from which it computes the "
            f"target model's logits. Either extract again with capture.final=[{want}] (one "
            f"more [seq, hidden] tensor per sample: {k + 1}/{k} of the disk of {k} layers), or "
            f"pass --final-state {LAST_LAYER} (final_state={LAST_LAYER!r} in Python) to use the "
            f"last captured layer (capture index {ds.layers[-1]}) in its place: that is not the "
            f"model's final state, so a drafter trained on it learns wrong targets (for "
            f"plumbing tests only)."
        )
    return want


def verifier_state(rec: dict, final: Optional[str]) -> Optional[torch.Tensor]:
    if final is None:
        return None
    if final == LAST_LAYER:
        return rec["hidden_states"][-1]
    return rec["final"][final]


def v1_record(rec: dict, final: Optional[str]) -> dict:
    """The speculators v1 dict `{"input_ids", "hidden_states", "loss_mask"}` for a record.

    `final` comes from `resolve_final_state`: its tensor is appended after the K captured
    layers, so `standardize_data_v1` concatenates all K captured layers as the drafter input
    (`hidden_states[:-1]`) and takes the final state as the verifier's (`hidden_states[-1]`).
    """
    hs = list(rec["hidden_states"])
    v = verifier_state(rec, final)
    if v is not None:
        hs.append(v)
    return {"input_ids": rec["input_ids"], "hidden_states": hs, "loss_mask": rec["loss_mask"]}


class SpeculatorsV1Dataset(torch.utils.data.Dataset):
    """`HsdumpDataset` seen as speculators v1 records (what `standardize_data_v1` expects)."""

    def __init__(self, ds: HsdumpDataset, final_state: str = "auto"):
        self.ds = ds
        self.final = resolve_final_state(ds, final_state, prefer="pre_norm")

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        return v1_record(self.ds[i], self.final)
