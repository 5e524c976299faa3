"""What `hsdump.pipeline` asks of an engine: the `Engine` protocol, its sink and its errors.

Two implementations: `hsdump.capture.engine.CaptureEngine` (SGLang in-process with hsdump's
scheduler patch, the one that captures real hidden states) and `hsdump.capture.dry.DryEngine`
(`engine=dry`: no SGLang, no GPU; rows of the model's real shapes computed from the token ids,
for checking a launch, the sharding, resume and `verify` before spending GPU hours).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
)

import torch

from hsdump.store.layout import FINAL_KINDS

if TYPE_CHECKING:
    from hsdump.capture.layers import ModelInfo
    from hsdump.config import EngineConfig, ModelConfig


@dataclass(frozen=True)
class CaptureSpec:
    """What every engine is built from, built once (by hsdump.pipeline or
    hsdump.capture.start.start): the model folder and its settings, the engine's settings, the
    captured layers (the user's order) and final kinds (the user's order: the writer's),
    whether `generate` will be called, and where a multi-node engine hands its row keys."""

    model_path: str
    model: "ModelConfig"
    engine: "EngineConfig"
    layers: Tuple[int, ...]
    info: "ModelInfo"
    final: Tuple[str, ...] = ()
    generates: bool = False
    run_dir: Optional[str] = None
    job_tag: str = ""

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))
        object.__setattr__(self, "final", tuple(self.final))
        unknown = [k for k in self.final if k not in FINAL_KINDS]
        if unknown:
            raise ValueError(f"final kinds {unknown}: use some of {', '.join(FINAL_KINDS)}")

    @property
    def engine_final(self) -> List[str]:
        """The final kinds in the order an engine captures them (FINAL_KINDS order)."""
        return [k for k in FINAL_KINDS if k in self.final]

    def sample(self, req: "Request", rows: Sequence[torch.Tensor], bad: Iterable[int]):
        """The CapturedSample of `req` from an engine's rows (one [seq, H] tensor per layer in
        the spec's order, then one per final kind in `engine_final` order) and `bad`, the
        indices into those rows that hold NaN/Inf."""
        k, engine_final = len(self.layers), self.engine_final
        if len(rows) != k + len(engine_final):
            raise ValueError(
                f"sample {req.sid}: {len(rows)} rows, not {k} layers + {len(engine_final)} final"
            )
        final = dict(zip(engine_final, rows[k:]))
        return CapturedSample(
            sid=req.sid,
            input_ids=list(req.input_ids),
            loss_mask=req.loss_mask,
            conversation=req.conversation,
            layers=list(rows[:k]),
            final={kind: final[kind] for kind in self.final},
            nonfinite=sorted(
                j if j < k else k + self.final.index(engine_final[j - k]) for j in bad
            ),
        )


@dataclass
class Request:
    """One sample to capture: its id, token ids and loss mask (None: rows not meant for a
    dataset, as the benchmarks drive an engine), and the conversation it was made from when the
    target model regenerated its answers (stored with the sample)."""

    sid: int
    input_ids: List[int]
    loss_mask: Optional[List[int]] = None
    conversation: Optional[list] = None


@dataclass
class CapturedSample:
    """A captured Request: everything the writer takes (DatasetWriter.add_sample). `layers`: one
    [seq, H] tensor per captured layer in the spec's order; `final`: {kind: [seq, H]} in the
    spec's final order; `nonfinite`: the indices into layers + final (that order) whose rows
    hold NaN/Inf, found on the device where the rows were captured."""

    sid: int
    input_ids: List[int]
    loss_mask: Optional[List[int]]
    layers: List[torch.Tensor]
    final: Dict[str, torch.Tensor] = field(default_factory=dict)
    nonfinite: List[int] = field(default_factory=list)
    conversation: Optional[Any] = None

    @property
    def rows(self) -> List[torch.Tensor]:
        """The layers' rows, then the final states' (the spec's final order)."""
        return [*self.layers, *self.final.values()]


# sink(sample): each captured sample, in the order the engine finishes them
Sink = Callable[[CapturedSample], None]


class Gate(Protocol):
    """What may hold the next request back (hsdump.online's disk cap): the engine awaits
    `wait(request)` before it submits each request, in its own request loop (CaptureEngine:
    a task on SGLang's event loop, beside the requests in flight, whose results it keeps
    handing to the sink meanwhile; DryEngine: asyncio.run). `wait` returns when the request
    may go, and raises to stop the run (the engine stops as on an error)."""

    async def wait(self, request: "Request") -> None: ...


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

    spec: CaptureSpec
    """What the engine was built from (its layers, final kinds, model, settings)."""

    max_prompt_tokens: Optional[int]
    """The longest prompt the running engine takes, as it says itself (None: not known)."""

    def run(
        self,
        samples: Iterable[Request],
        sink: Sink,
        on_stop_signal: OnSignal = None,
        refused: Optional[Callable[[int, str], None]] = None,
        gate: Optional[Gate] = None,
    ) -> bool:
        """Capture every Request and hand each to `sink` as a CapturedSample. A sample the engine refuses goes to
        `refused(sample_id, message)` and the others go on (without it: Refused is raised).
        `gate`: awaited before each request is submitted (Gate).
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
