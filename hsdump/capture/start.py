"""An engine for code that drives one itself (the benchmarks, the GPU tests): conf/engine/'s
presets as an `EngineConfig`, and the engine for a model folder, SGLang's (`CaptureEngine`) or
the dry one, built as an extraction builds it.

    ec = engine_preset("gpu", chunked_prefill_size=256)
    with start(model_path, [1, 3, 5], ec) as eng:
        eng.run([Request(i, p) for i, p in enumerate(prompts)], sink)

where `sink` gets each CapturedSample; `rows_manifest(model_path, [1, 3, 5])` is the manifest
of a DatasetWriter that takes them (`writer.add_sample`, with each Request's loss mask).
`open_engine(spec)` starts the engine a CaptureSpec asks for, as `hsdump.pipeline` does.

No sglang import here: `hsdump.capture.engine` is imported only when SGLang's engine starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from hsdump.capture.base import CaptureSpec, Engine
from hsdump.capture.dry import KIND as DRY
from hsdump.capture.layers import ModelInfo, read_model_info
from hsdump.command import config_dir
from hsdump.config import EngineConfig, ModelConfig
from hsdump.errors import Refusal

PRESETS = ("cpu", "gpu", "dry")
"""conf/engine/<name>.yaml: SGLang on the CPU, SGLang on NVIDIA GPUs, the dry engine."""


def engine_preset(name: str, **over: Any) -> EngineConfig:
    """conf/engine/NAME.yaml as an EngineConfig, with the fields of `over` replacing its own
    (`extra` is merged into the preset's)."""
    import yaml

    if name not in PRESETS:
        raise Refusal(f"engine preset {name!r}: use one of {', '.join(PRESETS)}")
    raw = yaml.safe_load((config_dir() / "engine" / f"{name}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    unknown = set(over) - {f.name for f in dataclasses.fields(EngineConfig)}
    if unknown:
        raise Refusal(f"engine preset {name}: no field {sorted(unknown)} in EngineConfig")
    extra = {**raw.pop("extra", {}), **over.pop("extra", {})}
    return EngineConfig(**{**raw, **over, "extra": extra})


def start(
    model_path: str,
    layers: Sequence[int],
    engine: EngineConfig,
    *,
    tp_size: int = 1,
    dtype: str = "bfloat16",
    final: Sequence[str] = (),
    generates: bool = False,
    info: Optional[ModelInfo] = None,
) -> Engine:
    """The started engine for the model folder `model_path`, capturing `layers` (the
    hf_hidden_states_index convention) and the final kinds `final`; `engine.kind` dry gives the
    dry engine. Call from `if __name__ == "__main__":` code or a test: SGLang spawns processes.
    The engine is a context manager (closed on exit)."""
    spec = CaptureSpec(
        model_path=model_path,
        model=ModelConfig(path=model_path, tp_size=tp_size, dtype=dtype),
        engine=engine,
        layers=tuple(layers),
        info=info or read_model_info(model_path),
        final=tuple(final),
        generates=generates,
    )
    return open_engine(spec)


def open_engine(spec: CaptureSpec) -> Engine:
    """The engine `spec` asks for, started: the dry one (engine.kind dry) or SGLang's."""
    if spec.engine.kind == DRY:
        from hsdump.capture.dry import DryEngine as EngineClass
    else:  # the sglang import happens only now
        from hsdump.capture.engine import CaptureEngine as EngineClass
    return EngineClass(spec)


def rows_manifest(
    model_path: str,
    layers: Sequence[int],
    info: Optional[ModelInfo] = None,
    storage_dtype: str = "bfloat16",
    final: Sequence[str] = (),
):
    """The manifest of the rows such an engine captures for the model folder, written from no
    dataset source: the model's facts, the layers and the storage dtype (Manifest.for_rows)."""
    from hsdump.store.manifest import Manifest

    info = info or read_model_info(model_path)
    return Manifest.for_rows(
        model=model_path,
        hidden_size=info.hidden_size,
        num_hidden_layers=info.num_hidden_layers,
        layers=layers,
        storage_dtype=storage_dtype,
        final=final,
        architecture=info.architecture,
    )
