"""`engine=dry`: an engine with no SGLang and no GPU, for checking a run before it costs GPU hours.

`DryEngine` implements hsdump.capture.base.Engine. Its rows have the model's real shapes (one
[seq, hidden_size] tensor per captured layer, then one per final kind, in the model's dtype)
and are a deterministic function of the token ids, their positions and the layer: the same
sample gives the same rows in every run, job and resume, so a dry run exercises everything
hsdump does around the engine (tokenizing, sharding, the disk estimate, commits, kills and
resume, signals, many jobs, launchers, `verify`) exactly as a real run would. The rows are not
a model's hidden states: a dry dataset says `engine: dry` in its manifest, and `hsdump export`
and the loader refuse it unless asked explicitly (`--allow-dry`, `allow_dry=True`).

`generate` (regeneration) answers each request with a few words picked from the prompt's ids,
so regeneration's bookkeeping (windows, skips after regeneration, stored conversations,
token_freq.json) runs too. `engine.dry_tokens_per_s` paces it like a slow engine (0: as fast as
it can), so a signal or a kill can land mid-run. HSDUMP_DRY_REFUSE=ID,ID,... makes it refuse
those samples as SGLang refuses a request (a bad row, `Refused`), so a run's handling of rows
the engine refuses runs too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from hsdump.capture.base import CaptureSpec, OnSignal, Refused, Request, Sink
from hsdump.store.layout import DRY, FINAL_KINDS, torch_dtype

log = logging.getLogger(__name__)

KIND = DRY
"""engine.kind and the manifest's `engine` value of a dry run."""
REFUSE_ENV = "HSDUMP_DRY_REFUSE"
"""Sample ids (comma-separated) the dry engine refuses, as SGLang refuses a bad request."""

_WORDS = (
    "the", "rows", "of", "a", "dry", "run", "are", "not", "hidden", "states", "check", "launch",
    "shards", "resume", "verify", "before", "spending", "gpu", "hours", "on", "it",
)  # fmt: skip


def dry_rows(ids: Sequence[int], keys: Sequence[int], hidden: int, dtype) -> List[torch.Tensor]:
    """One [len(ids), hidden] tensor per key (a layer index, or a final kind's code): values in
    [-4, 4], a smooth function of (token id, position, key, channel). Finite by construction."""
    t = torch.as_tensor(list(ids), dtype=torch.float64).unsqueeze(1)  # [seq, 1]
    pos = torch.arange(len(ids), dtype=torch.float64).unsqueeze(1)
    ch = torch.arange(hidden, dtype=torch.float64).unsqueeze(0)  # [1, H]
    out = []
    for key in keys:
        x = torch.sin(t * 0.618034 * (ch + 1) + pos * 0.01 + key * 1.3) * 4.0
        out.append(x.to(dtype))
    return out


class DryEngine:
    """The `Engine` of `engine=dry` (see the module's docstring). It takes the CaptureSpec
    CaptureEngine takes; only the shapes, the layers and the pacing are used."""

    def __init__(self, spec: CaptureSpec):
        self.spec = spec
        info, dtype = spec.info, spec.model.dtype
        self.hidden = info.hidden_size
        self.dtype = torch_dtype(dtype if dtype != "auto" else "bfloat16")
        self._keys = list(spec.layers) + [
            info.num_hidden_layers + 1 + FINAL_KINDS.index(k) for k in spec.engine_final
        ]
        self._tokens_per_s = float(getattr(spec.engine, "dry_tokens_per_s", 0.0) or 0.0)
        self._stop = False
        self._aborted = False
        self.max_prompt_tokens: Optional[int] = None
        self._refuse = {int(x) for x in os.environ.get(REFUSE_ENV, "").split(",") if x.strip()}
        log.info("dry engine: no SGLang; rows are a function of the token ids, not hidden states")

    # ---------------------------------------------------------------- stopping
    @property
    def stop_requested(self) -> bool:
        return self._stop

    def request_stop(self) -> None:
        self._stop = True

    def abort(self) -> None:
        self._aborted = True
        self._stop = True

    def close(self) -> None:
        self._stop = True

    def __enter__(self) -> "DryEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _signals(self, on_stop_signal: OnSignal):
        """SIGINT and SIGTERM to `on_stop_signal` while a call runs; the old handlers back."""
        if on_stop_signal is None:
            return {}
        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            name = signal.Signals(sig).name
            old[sig] = signal.signal(sig, lambda s, f, name=name: on_stop_signal(name))
        return old

    def _pace(self, tokens: int) -> None:
        if self._tokens_per_s > 0:
            end = time.monotonic() + tokens / self._tokens_per_s
            while not self._aborted and time.monotonic() < end:
                time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        if self._aborted:
            raise KeyboardInterrupt

    # ---------------------------------------------------------------- driving
    def run(
        self,
        samples: Iterable[Request],
        sink: Sink,
        on_stop_signal: OnSignal = None,
        refused=None,
        gate=None,
    ) -> bool:
        old = self._signals(on_stop_signal)
        try:
            for req in samples:
                if self._stop:
                    break
                if gate is not None:  # no event loop here: the gate's await on one of its own
                    asyncio.run(gate.wait(req))
                    if self._stop:
                        break
                if req.sid in self._refuse:
                    e = Refused(req.sid, f"refused by {REFUSE_ENV} (engine=dry)")
                    if refused is None:
                        raise e
                    refused(req.sid, e.reason)
                    continue
                self._pace(len(req.input_ids))
                rows = dry_rows(req.input_ids, self._keys, self.hidden, self.dtype)
                sink(self.spec.sample(req, rows, []))
            if self._aborted:
                raise KeyboardInterrupt
            return not self._stop
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def generate(
        self, requests: Sequence[Tuple[object, List[int], dict]], on_stop_signal: OnSignal = None
    ) -> Dict[object, dict]:
        old = self._signals(on_stop_signal)
        out: Dict[object, dict] = {}
        try:
            for key, ids, sp in requests:
                if self._stop:
                    break
                n = max(1, int(sp.get("max_new_tokens") or 16))  # words, about a token each
                words = [_WORDS[(int(ids[-1 - k % len(ids)]) + k) % len(_WORDS)] for k in range(n)]
                self._pace(len(ids) + n)
                out[key] = {
                    "text": "dry " + " ".join(words) + ".",
                    "output_ids": [int(ids[-1 - k % len(ids)]) for k in range(n)],
                    "finish_reason": {"type": "length", "length": n},
                }
            if self._aborted:
                raise KeyboardInterrupt
            return out
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
