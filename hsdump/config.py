"""The configuration schema: one dataclass per Hydra config group.

`register_configs()` puts them in Hydra's ConfigStore; the YAML files under `conf/` start from
these schemas, so a typo in an override fails at composition time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

MISSING = "???"  # omegaconf's marker for a value the user must give; no import needed here

DTYPES = ("bfloat16", "float16", "float32")
ON_BAD = ("raise", "skip")


@dataclass
class ModelConfig:
    path: str = MISSING
    """HF folder or hub id of the target model; `tiny:llama` / `tiny:qwen3` build a tiny random one."""
    name: str = "model"
    """Short name used in the default output directory."""
    tokenizer: Optional[str] = None
    """Tokenizer folder or hub id; defaults to `path`."""
    chat_template: Optional[str] = None
    """A Jinja file that replaces the tokenizer's own chat template."""
    dtype: str = "bfloat16"
    """Dtype the engine runs the model in."""
    tp_size: int = 1
    """Tensor-parallel size of the SGLang engine."""
    default_layers: Optional[List[int]] = None
    """The preset's recommended capture layers, used when `capture.layers` is unset."""
    trust_remote_code: bool = False
    """Run code shipped with the model or tokenizer. Off unless you trust the source."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r}: use one of {DTYPES}")
        if self.tp_size < 1:
            raise ValueError(f"model.tp_size={self.tp_size}: must be >= 1")


@dataclass
class DatasetConfig:
    path: str = MISSING
    """Hub dataset name, a local .json/.jsonl/.parquet file, or a `save_to_disk` folder."""
    name: Optional[str] = None
    """Hub dataset config name."""
    split: str = "train"
    revision: Optional[str] = None
    column: Optional[str] = None
    """Column holding the conversation; detected (`conversations` or `messages`) when unset."""
    max_samples: Optional[int] = None
    """Use only the first N rows of the split."""
    max_seq_len: int = 2048
    """Token budget per sample after the chat template."""
    truncation: str = "truncate"
    """What to do with longer samples: `truncate` or `skip`."""
    on_bad_row: str = "raise"
    """`raise` on a malformed row, or `skip` it and count it in the summary."""
    num_proc: int = 1
    """Worker processes for tokenization (`datasets.map`)."""

    def __post_init__(self) -> None:
        if self.truncation not in ("truncate", "skip"):
            raise ValueError(f"dataset.truncation={self.truncation!r}: use 'truncate' or 'skip'")
        if self.on_bad_row not in ON_BAD:
            raise ValueError(f"dataset.on_bad_row={self.on_bad_row!r}: use one of {ON_BAD}")
        if self.max_seq_len < 2:
            raise ValueError(f"dataset.max_seq_len={self.max_seq_len}: must be >= 2")


@dataclass
class CaptureConfig:
    layers: Optional[List[int]] = None
    """Capture indices in the hf_hidden_states_index convention; unset: model.default_layers,
    else EAGLE-3's [2, L//2, L-3]."""


@dataclass
class EngineConfig:
    device: str = "cuda"
    attention_backend: Optional[str] = None
    sampling_backend: Optional[str] = None
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    max_total_tokens: Optional[int] = None
    disable_cuda_graph: bool = False
    chunked_prefill_size: int = -1
    """Tokens per prefill chunk; -1 disables chunking. hsdump stitches every chunk's rows."""
    max_prefill_tokens: int = 16384
    """Batch size in tokens of one prefill forward."""
    inflight_tokens: int = 65536
    """Tokens hsdump keeps submitted to the engine at once (bounds host staging memory)."""
    log_level: str = "warning"
    extra: Dict[str, Any] = field(default_factory=dict)
    """Further `sglang.Engine` keyword arguments, passed through unchanged."""

    def __post_init__(self) -> None:
        if self.inflight_tokens < 1:
            raise ValueError("engine.inflight_tokens must be >= 1")


@dataclass
class OutputConfig:
    root: str = "outputs"
    """Folder under which the default `dir` is named after model and layer set."""
    dir: str = MISSING
    """Dataset directory. Re-running into it resumes."""
    shard_bytes: int = 1 << 30
    """Target size of one shard file."""
    dtype: str = "bfloat16"
    """Storage dtype of hidden states."""
    overwrite: bool = False
    """Delete an existing dataset in `dir` and start over."""
    on_nonfinite: str = "raise"
    """A sample with NaN/Inf: `raise`, or `skip` it and record it in the manifest."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"output.dtype={self.dtype!r}: use one of {DTYPES}")
        if self.shard_bytes < 1:
            raise ValueError("output.shard_bytes must be >= 1")
        if self.on_nonfinite not in ON_BAD:
            raise ValueError(f"output.on_nonfinite={self.on_nonfinite!r}: use one of {ON_BAD}")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Show a progress bar."""


def layers_tag(layers: Optional[List[int]], default_layers: Optional[List[int]] = None) -> str:
    """Directory-name form of a layer set: [3, 31, 59] -> 'layers-3-31-59'."""
    chosen = layers if layers is not None else default_layers
    if chosen is None:
        return "layers-eagle3"
    return "layers-" + "-".join(str(int(x)) for x in chosen)


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("layers_tag"):
        OmegaConf.register_new_resolver("layers_tag", layers_tag)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="capture", name="capture_schema", node=CaptureConfig)
    cs.store(group="engine", name="engine_schema", node=EngineConfig)
    cs.store(group="output", name="output_schema", node=OutputConfig)


def to_config(cfg: Any) -> Config:
    """A composed DictConfig (or plain dict) to the typed `Config`, running the field checks."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)
    return OmegaConf.to_object(cfg)
