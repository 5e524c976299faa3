"""Read an hsdump dataset: speculators v1 records by sample id, lazily through `safe_open`.

Only `index.json` decides what is in the dataset; shard files it does not list are never
opened. No sglang or Hydra import here: trainers can use this module alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List

import torch
from safetensors import safe_open

FORMAT = "hsdump/speculators-v1"
SUPPORTED_VERSIONS = (1,)


class HsdumpDataset(torch.utils.data.Dataset):
    """`ds[i]` is the i-th sample in id order; `ds.get(sample_id)` looks one up by id.

    A record is `{"id", "input_ids": int64[seq], "loss_mask": int64[seq],
    "hidden_states": [K tensors [seq, H]]}` with `hidden_states[j]` at capture index
    `ds.layers[j]`.
    """

    def __init__(self, path: str):
        self.path = Path(path)
        index_file = self.path / "index.json"
        if not index_file.exists():
            raise FileNotFoundError(f"{self.path} has no index.json: not an hsdump dataset, or "
                                    "no shard was committed yet")
        with open(index_file) as f:
            self.index = json.load(f)
        with open(self.path / "manifest.json") as f:
            self.manifest = json.load(f)
        if self.index.get("format") != FORMAT or \
                self.index.get("format_version") not in SUPPORTED_VERSIONS:
            raise ValueError(f"{self.path}: format {self.index.get('format')!r} version "
                             f"{self.index.get('format_version')!r} is not one this reader knows")
        self.layers: List[int] = list(self.manifest["layers"])
        self.ids: List[int] = sorted(int(s) for s in self.index["samples"])
        self._shard_of: Dict[int, str] = {int(s): n for s, n in self.index["samples"].items()}
        self._handles: Dict[str, object] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return self.get(self.ids[i])

    def __iter__(self) -> Iterator[dict]:
        for sid in self.ids:
            yield self.get(sid)

    def __contains__(self, sid: int) -> bool:
        return sid in self._shard_of

    def _open(self, shard: str):
        h = self._handles.get(shard)
        if h is None:
            h = safe_open(str(self.path / shard), framework="pt")
            self._handles[shard] = h
        return h

    def get(self, sid: int) -> dict:
        if sid not in self._shard_of:
            raise KeyError(f"sample {sid} is not in {self.path}")
        f = self._open(self._shard_of[sid])
        return {
            "id": sid,
            "input_ids": f.get_tensor(f"{sid}/input_ids"),
            "loss_mask": f.get_tensor(f"{sid}/loss_mask"),
            "hidden_states": [f.get_tensor(f"{sid}/hidden_states/{j}")
                              for j in range(len(self.layers))],
        }

    def __getstate__(self):  # DataLoader workers open their own handles
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state


def open_dataset(path: str) -> HsdumpDataset:
    return HsdumpDataset(path)
