"""What `hsdump.pipeline` asks of an engine: the `Engine` protocol, its sink and its errors.

Two implementations: `hsdump.capture.engine.CaptureEngine` (SGLang in-process with hsdump's
scheduler patch, the one that captures real hidden states) and `hsdump.capture.dry.DryEngine`
(`engine=dry`: no SGLang, no GPU; rows of the model's real shapes computed from the token ids,
for checking a launch, the sharding, resume and `verify` before spending GPU hours).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

import torch

# sink(sample_id, input_ids, hidden_states, nonfinite): nonfinite lists the indices into
# hidden_states whose rows hold NaN or Inf, found on the device where the rows were captured
Sink = Callable[[int, List[int], List[torch.Tensor], List[int]], None]

# on_stop_signal(name): SIGINT or SIGTERM arrived while the engine ran
OnSignal = Optional[Callable[[str], None]]


FORBID_ENV = "HSDUMP_FORBID_ENGINE"
"""Set (by the tests' conftest.py for a test not marked `engine`): starting SGLang raises
(hsdump.capture.engine.forbid_engine); `hsdump ray` hands it on to its jobs."""


class EngineDied(RuntimeError):
    """An engine process exited while hsdump was running."""


REFUSED = "engine_refused"
"""The bad-row reason of a sample the engine refused (commit log: `engine_refused: <message>`)."""


class Refused(RuntimeError):
    """The engine refused one sample as a bad request (SGLang's own checks: a prompt longer
    than it takes, say): that sample is a bad row, not an engine failure. `Engine.run` hands it
    to its `refused` callback, or raises this without one."""

    def __init__(self, sid, message: str):
        super().__init__(f"sample {sid}: SGLang refused it: {message}")
        self.sid, self.reason = sid, message


class Engine(Protocol):
    """An open engine for one run: `run` (prefill and capture) and `generate` (regeneration),
    stopped by `request_stop` (samples in flight finish) or `abort` (at once), then `close`."""

    final: List[str]
    """The final-state kinds each sample's rows end with, in FINAL_KINDS order."""

    max_prompt_tokens: Optional[int]
    """The longest prompt the running engine takes, as it says itself (None: not known)."""

    def run(
        self,
        samples: Iterable[Tuple[int, List[int]]],
        sink: Sink,
        on_stop_signal: OnSignal = None,
        refused: Optional[Callable[[int, str], None]] = None,
    ) -> bool:
        """Capture every (sample_id, input_ids) and hand each to `sink(sample_id, input_ids,
        hidden_states, nonfinite)`: hidden_states is one [seq, H] tensor per captured layer in
        the run's layer order, then one per final kind. A sample the engine refuses goes to
        `refused(sample_id, message)` and the others go on (without it: Refused is raised).
        False if `request_stop()` ended it early; KeyboardInterrupt after `abort()`;
        EngineDied if the engine died."""
        ...

    def generate(
        self, requests: Sequence[Tuple[object, List[int], dict]], on_stop_signal: OnSignal = None
    ) -> Dict[object, dict]:
        """A continuation of each (key, input_ids, sampling_params): {key: {"text",
        "output_ids", "finish_reason"}}; what finished when `request_stop()` ended it."""
        ...

    @property
    def stop_requested(self) -> bool: ...

    def request_stop(self) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...
