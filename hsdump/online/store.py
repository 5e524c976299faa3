"""The trainer side's FeatureStore (SpecForge 0.2.0's interface): hsdump's shards, read where
the producer wrote them, nothing written twice.

`get(ref)` reads the sample from its shard (safetensors; fp8 dequantized to bf16 as hsdump's
reader does), builds the record `hsdump export --to specforge --kind K` would have written for
it (hsdump.tools.export.specforge_record) and hands it to SpecForge's own offline normalizer of
the kind: the tensors its trainer sees are those of an offline run on the export, by
construction. `abort(sample_id)` (SpecForge's consumer calls it once the optimizer step that
trained the sample is durable in its ledger, and for the tail it drops) records the sample as
acknowledged and deletes every shard all of whose samples are (hsdump.online.folder.ShardBook).
`release` keeps the data (the consumer requires retain_on_release=True: deletion waits for the
durable ack). Imports SpecForge: it runs in the trainer's environment.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from specforge.runtime.contracts import FeatureHandle, SampleRef
from specforge.runtime.data_plane.feature_store import FeatureStore

from hsdump.online import folder as F


def read_sample(shard: Path, sid: int) -> dict:
    """Sample `sid` of `shard` as HsdumpDataset.get gives it (hidden states as stored, fp8
    dequantized to bf16 with its per-token scales)."""
    from safetensors import safe_open

    from hsdump.store import fp8

    with safe_open(str(shard), framework="pt") as f:
        names = set(f.keys())

        def state(name):
            t = f.get_tensor(name)
            if t.dtype == fp8.FP8_DTYPE:
                return fp8.dequantize(t, f.get_tensor(name + fp8.SCALE_SUFFIX), torch.bfloat16)
            return t

        rec = {
            "id": sid,
            "input_ids": f.get_tensor(f"{sid}/input_ids"),
            "loss_mask": f.get_tensor(f"{sid}/loss_mask"),
        }
        hs, j = [], 0
        while f"{sid}/hidden_states/{j}" in names:
            hs.append(state(f"{sid}/hidden_states/{j}"))
            j += 1
        rec["hidden_states"] = hs
        final = {
            k: state(f"{sid}/final/{k}")
            for k in ("pre_norm", "post_norm")
            if f"{sid}/final/{k}" in names
        }
        if final:
            rec["final"] = final
    return rec


class HsdumpFeatureStore(FeatureStore):
    """SpecForge's FeatureStore over an hsdump online folder (see the module's docstring)."""

    def __init__(
        self,
        folder,
        *,
        retain_on_release: bool = True,
        max_length: Optional[int] = None,
        dtype: Optional[str] = None,
    ):
        """`max_length`: the trainer's data.max_length (its normalizer truncates to it, as
        offline); None: the producer's (online.json). `dtype`: the trainer's model.torch_dtype;
        the float tensors are handed over in it (SpecForge feeds them to the drafter as they
        come, and a bf16 state into a float32 drafter is an error); None: as stored."""
        from specforge.algorithms.builtin import builtin_algorithm_registry

        from hsdump.tools.export import specforge_record

        self.folder = Path(folder)
        plan_path = self.folder / F.PLAN
        if not plan_path.exists():
            raise FileNotFoundError(
                f"{plan_path} is missing: start hsdump's capture on this folder "
                "(python extract.py online=specforge online.folder=...) first"
            )
        self.plan = json.loads(plan_path.read_text())
        self.kind = self.plan["kind"]
        provider = builtin_algorithm_registry().resolve(self.kind).providers.offline_for("text")
        self._normalize = provider.build_normalizer(
            int(max_length or self.plan["max_length"]), ttt_length=1, use_usp_preprocess=False
        )
        self._record = specforge_record
        self.dtype = getattr(torch, dtype) if dtype else None
        self.retain_on_release = retain_on_release
        self.book = F.ShardBook(self.folder)
        self._lock = threading.Lock()
        self._leases = 0
        self.store_id = F.RUN_ID

    def put(self, tensors, *, sample_id: str, metadata: Dict[str, Any]) -> SampleRef:
        raise NotImplementedError("hsdump's capture writes this store's samples")

    def get(
        self,
        sample_ref: SampleRef,
        *,
        device: "torch.device | str" = "cpu",
        names: Optional[List[str]] = None,
    ) -> Tuple[Dict[str, torch.Tensor], FeatureHandle]:
        epoch, sid = F.parse_sample_id(sample_ref.sample_id)
        shard = F.epoch_dir(self.folder, epoch) / sample_ref.metadata["shard"]
        if not shard.exists():
            raise KeyError(
                f"sample {sample_ref.sample_id}: {shard} is gone (its samples were all "
                "acknowledged, or the run's folder was cleaned)"
            )
        rec = read_sample(shard, sid)
        raw = self._record(rec, self.plan["final"], self.plan["pick"], self.kind)
        out = self._normalize(raw)
        wanted = names or list(sample_ref.feature_keys) or list(out)
        out = {k: out[k] for k in wanted}
        # one copy at most per tensor: to the trainer's device and, the float ones, its dtype
        dev = None if str(device) == "cpu" else device
        out = {k: v.to(device=dev, dtype=self.dtype if v.is_floating_point() else None)
               for k, v in out.items()}  # fmt: skip
        with self._lock:
            self._leases += 1
            token = f"{sample_ref.sample_id}:{self._leases}"
        return out, FeatureHandle(sample_id=sample_ref.sample_id, generation=1, lease_token=token)

    def release(self, handle: FeatureHandle, *, reason: str = "consumed") -> None:
        # deletion waits for the durable acknowledgement (abort); a released lease keeps it
        return None

    def abort(self, sample_id: str, *, reason: str = "aborted") -> None:
        with self._lock:
            self.book.ack([sample_id])

    def health(self) -> Dict[str, Any]:
        with self._lock:
            self.book.refresh()
            resident = self.book.resident()
        return {
            "store_id": self.store_id,
            "backend": "hsdump",
            "root": str(self.folder / F.STORE),
            "resident_shards": len(resident),
            "resident_bytes": sum(b for _, b in resident),
            "release_pending": 0,
            "pid": os.getpid(),
        }
