"""One extraction run: dataset -> tokens -> engine -> writer, with progress and a summary.

`run` is a sequence of named steps: `check_model` (paths, config, layers), `tokenize`,
`dataset_keys` (the resume key and the manifest), `open_dataset` (writer, what is left to do,
disk space), `start_engine`, `capture` (rows to the writer) and `finish` (commit, summary).
Each stage logs one line; SGLang's own start-up output is hidden unless
`engine.log_level=info` (or debug) asks for it (`sglang_output`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hsdump.capture.base import REFUSED, CapturedSample, CaptureSpec, Engine, EngineDied, Request
from hsdump.capture.dry import KIND as DRY
from hsdump.capture.families import Family, check_kinds, check_verified, installed_sglang
from hsdump.capture.kinds import capture_layers, manifest_kinds
from hsdump.capture.layers import (
    ModelInfo,
    check_length_limit,
    length_limit,
    read_model_info,
)
from hsdump.capture.nodes import NodeLayout, find_layout
from hsdump.capture.start import open_engine
from hsdump.config import Config, OutputConfig
from hsdump.corpus.chat import chat_template_of, template_sha256
from hsdump.corpus.coherence import check_tokenizer
from hsdump.corpus.formats import detect_format
from hsdump.corpus.sources import content_fingerprint, load_rows
from hsdump.corpus.tokenization import Tokenized, tokenize_dataset
from hsdump.corpus.tokenizer import load_tokenizer
from hsdump.dist import owns, writer_tag
from hsdump.errors import Refusal
from hsdump.locate import check_model_path
from hsdump.store.files import fault, size_text
from hsdump.store.layout import STORAGE_BYTES
from hsdump.store.manifest import Manifest, ModelFacts, ResumeKey, Source, versions
from hsdump.store.stats import count_if_complete, write_token_freq
from hsdump.store.writer import DatasetWriter
from hsdump.tiny import resolve_model_path

log = logging.getLogger(__name__)


class Interrupted(RuntimeError):
    """The run stopped early (signal or engine failure); what was committed is safe."""


def _existing_parent(path: str) -> str:
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    return probe


_WHY = {
    errno.EROFS: "it is on a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "its disk is full",
    errno.EDQUOT: "its disk quota is used up",
    errno.ENOENT: "no folder can be created there",
}


def check_output_dir(out_dir: str) -> None:
    """Refuse, before anything is loaded, an output.dir that is a file, that cannot be
    created, or whose folder cannot be written: a ValueError naming output.dir and the fix.
    Nothing is left behind (the probe is a temporary folder, removed)."""
    fix = "choose another output.dir"
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise Refusal(
            f"output.dir={out_dir} is a file, not a folder; {fix} (or move the file away)"
        )
    parent = _existing_parent(out_dir)
    if not os.path.isdir(parent):
        raise Refusal(
            f"output.dir={out_dir} cannot be created: {parent} is a file, not a folder; {fix}"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hsdump-probe-", dir=parent))
    except OSError as e:
        why = _WHY.get(e.errno, e.strerror or str(e))
        where = "" if parent == os.path.abspath(out_dir) else f" (in {parent})"
        raise Refusal(
            f"output.dir={out_dir} cannot be written{where}: {why}; {fix} on a writable disk"
        ) from None


def output_error(e: BaseException, out_dir: str) -> str:
    """A write error of the run as one line that names output.dir; committed samples stay."""
    from hsdump.store.writer import WriteError

    if isinstance(e, WriteError):
        return str(e)
    name = os.path.abspath(getattr(e, "filename", None) or out_dir)
    if os.path.commonpath([name, os.path.abspath(out_dir)]) != os.path.abspath(out_dir):
        return str(e)  # not the output's: as it is
    why = _WHY.get(getattr(e, "errno", None), str(e))
    return (
        f"writing to output.dir={out_dir} failed: {why} ({e}). Samples committed before "
        "are intact; fix the cause (free disk space, or choose another output.dir) and "
        "run the same command again to resume."
    )


def check_space(out_dir: str, need: int, policy: str) -> None:
    free = shutil.disk_usage(_existing_parent(out_dir)).free
    if need <= free or policy == "off":
        return
    msg = (
        f"the run will write about {size_text(need)} to output.dir={out_dir} but only "
        f"{size_text(free)} are free; free space, use another output.dir, or set "
        "output.space_check=warn"
    )
    if policy == "raise":
        raise Refusal(msg)
    log.warning(msg)


@dataclass
class Summary:
    out_dir: str
    layers: List[int]
    written: int = 0
    already_done: int = 0
    skipped: Dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    bytes: int = 0
    wall_s: float = 0.0
    engine_start_s: float = 0.0
    generated_tokens: int = 0
    generate_s: float = 0.0
    engine: str = "sglang"
    truncated: int = 0
    """The dataset's samples cut at dataset.max_seq_len when tokenized (manifest's
    tokenized.truncated; every job's)."""
    max_seq_len: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def lines(self) -> List[str]:
        rate = self.tokens / self.wall_s if self.wall_s else 0.0
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())) or "none"
        regen = (
            [
                f"regenerated: {self.generated_tokens:,} tokens generated in "
                f"{self.generate_s:.1f} s ({self.generated_tokens / self.generate_s:,.0f} "
                "tokens/s)"
            ]
            if self.generate_s
            else []
        )
        return (
            regen
            + [
                f"dataset: {self.out_dir} (layers {self.layers})",
                f"samples written: {self.written}, already committed before this run: "
                f"{self.already_done}",
                f"samples skipped: {sum(self.skipped.values())} ({skipped})",
            ]
            + (
                [
                    f"samples truncated: {self.truncated} cut at dataset.max_seq_len="
                    f"{self.max_seq_len} (their rows end there; dataset.truncation=skip leaves "
                    "them out)"
                ]
                if self.truncated
                else []
            )
            + [
                f"tokens: {self.tokens} ({rate:,.0f} tokens/s over the run)",
                f"bytes written: {self.bytes:,} ({self.bytes / max(self.written, 1):,.0f} per sample)",
                f"wall time: {self.wall_s:.1f} s (engine start {self.engine_start_s:.1f} s)",
                f"check it: {hsdump_command()} verify {shlex.quote(self.out_dir)}",
                "load it:  from hsdump.store.reader import HsdumpDataset; "
                f"ds = HsdumpDataset({json.dumps(self.out_dir)}"
                f"{', allow_dry=True' if self.engine == DRY else ''}); rec = ds[0]",
            ]
            + (
                [
                    "engine=dry: the rows are not hidden states; extract again with a real engine to train"
                ]
                if self.engine == DRY
                else []
            )
        )


def hsdump_command() -> str:
    """How to call the hsdump command from here: `hsdump` when it is on PATH, else this
    environment's script (e.g. .venv/bin/hsdump after `make setup`), else python -m hsdump."""
    if shutil.which("hsdump"):
        return "hsdump"
    script = os.path.join(os.path.dirname(sys.executable), "hsdump")
    if os.path.isfile(script):
        rel = os.path.relpath(script)
        return shlex.quote(script if rel.startswith("..") else rel)
    return f"{shlex.quote(sys.executable)} -m hsdump"


def rows_in_flight(
    out: OutputConfig, inflight_tokens: int, max_seq_len: int, row_bytes: int
) -> int:
    """Tokens of captured rows the engine may have in flight under `out.max_host_bytes`.

    The budget holds writer_threads + 2 shards (one filling, one queued, the rest being
    written; see writer.py), each of up to max(shard_bytes, one sample) bytes (a sample larger
    than a shard is a shard of its own), the rows in flight, and one more sample of
    max_seq_len rows: a sample prefilled in several chunks is stitched into one copy per slot
    before its chunks are freed (rows.Receiver.take). The rows in flight are at most
    max(engine.inflight_tokens, one sample): the engine always admits one request, however
    long (hsdump.capture.engine), so an inflight_tokens below dataset.max_seq_len (engine=cpu
    and engine=dry: 8192, a 32K-context model) runs its longest samples one at a time. Raises,
    naming output.max_host_bytes and the bytes that hold one sample, when the budget holds less
    than one sample in flight."""
    sample = max_seq_len * row_bytes
    held = out.held_bytes(sample) + sample
    room = max(0, out.max_host_bytes - held) // row_bytes
    if room < max_seq_len:
        need = held + sample
        raise Refusal(
            f"output.max_host_bytes={out.max_host_bytes} holds {out.writer_threads + 2} shards "
            f"of {max(out.shard_bytes, sample)} bytes and one stitched sample, and leaves room "
            f"for only {room} tokens of rows in flight ({row_bytes} bytes per token), less "
            f"than one sample of dataset.max_seq_len={max_seq_len}: set output.max_host_bytes="
            f"{need} ({need / 2**30:.1f} GiB) or more, or lower output.shard_bytes or "
            "output.writer_threads (engine.inflight_tokens does not help: the engine admits "
            "one sample whatever it is)"
        )
    return min(inflight_tokens, room)


# --------------------------------------------------------------------------- SGLang's output
def sglang_verbose(engine_log_level: str) -> bool:
    """SGLang's own output is shown at engine.log_level=info or debug, or when Hydra's verbose
    flag names it (`hydra.verbose=true`, or `hydra.verbose=[sglang]`)."""
    named = logging.getLogger("sglang").level
    return (
        engine_log_level.lower() in ("info", "debug")
        or logging.getLogger().level == logging.DEBUG
        or logging.NOTSET < named <= logging.DEBUG
    )


def _sigquit_notice(record: logging.LogRecord) -> bool:
    # SGLang logs at ERROR level that a custom SIGQUIT handler (hsdump's) is installed
    return not (
        logging.getLogger("sglang").level >= logging.ERROR
        and str(record.msg).startswith("Using custom SIGQUIT handler")
    )


@contextlib.contextmanager
def sglang_output(verbose: bool):
    """Around the engine's start. Quiet (the default): SGLang's start-up noise is hidden in this
    process (its loggers at ERROR: the model registry's ~30 "Ignore import error when loading
    sglang.srt.models..." warnings, plugin and server-args lines; its UserWarnings) and in the
    processes it spawns (PYTHONWARNINGS, and log_level=error which `start_engine` passes).
    Either way SGLang replaces the root logger's handlers (logging.basicConfig(force=True)) in
    this process; they are put back afterwards so hsdump's lines keep going where they went."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    env = os.environ.get("PYTHONWARNINGS")
    with warnings.catch_warnings():
        quiet = {"sglang": logging.ERROR, "hsdump.capture.engine": logging.WARNING}
        for name, lvl in quiet.items():  # set for the rest of the process, reset when verbose
            logger = logging.getLogger(name)
            if not verbose:
                logger.setLevel(lvl)
            elif logger.level == lvl:
                logger.setLevel(logging.NOTSET)
        if not verbose:
            warnings.filterwarnings("ignore", module=r"sglang(\.|$)")
            eng = logging.getLogger("sglang.srt.entrypoints.engine")
            if _sigquit_notice not in eng.filters:
                eng.addFilter(_sigquit_notice)
            os.environ["PYTHONWARNINGS"] = ",".join(x for x in (env, "ignore::UserWarning") if x)
        try:
            yield
        finally:
            if env is None:
                os.environ.pop("PYTHONWARNINGS", None)
            else:
                os.environ["PYTHONWARNINGS"] = env
            root.handlers[:] = handlers
            root.setLevel(level)


# --------------------------------------------------------------------------- the run's steps
# Each step returns what it makes; `run` hands it on to the steps that need it.
@dataclass(frozen=True)
class Model:
    """check_model's result: the model's folder, its config.json facts, its verified family
    (None when the user allowed an unverified class) and the layers to capture."""

    path: str
    info: ModelInfo
    family: Optional[Family]
    layers: List[int]


@dataclass(frozen=True)
class Corpus:
    """tokenize's result: the tokenizer, the dataset's rows and their samples."""

    tok: Any
    rows: Any
    data: Tokenized


@dataclass
class Job:
    """open_dataset's result: the open writer, this job's samples left to do (indices into the
    corpus), the rows the engine may keep in flight, and the summary filled as the run goes."""

    writer: DatasetWriter
    todo: List[int]
    todo_tokens: int
    inflight: int
    summary: Summary
    t0: float


def run(cfg: Config, resolved_config: Optional[dict] = None, hooks=None) -> Summary:
    """`hooks` (hsdump.online.producer's): `plan(job, corpus)` orders or skips the job's
    samples once the dataset is open; `open_engine(start)` gives the engine (`start()` makes
    one; the hooks keep it for the next run and close it themselves); `gate(engine)` is the
    Gate its engine awaits before each request (None: none)."""
    t0 = time.time()
    check_output_dir(cfg.output.dir)
    model = check_model(cfg)
    if cfg.check.logprob_samples:  # the in-run check's LM head and norm, found before any work
        from hsdump.check_final import head_names

        head_names(model.path)
    cfg = with_length_limit(cfg, model.info)
    layout = node_layout(cfg)
    if layout.multi:  # the engine takes the layout as resolved here, SLURM's included
        cfg = dataclasses.replace(
            cfg,
            engine=dataclasses.replace(
                cfg.engine,
                nnodes=layout.nnodes,
                node_rank=layout.node_rank,
                dist_init_addr=layout.dist_init_addr,
            ),
        )
    if not layout.is_head:
        return follow_node(cfg, model, layout, t0)
    corpus = tokenize(cfg, model)
    manifest = dataset_keys(cfg, model, corpus, resolved_config)
    job = open_dataset(cfg, model, corpus, manifest, t0)
    if hooks is not None:
        hooks.plan(job, corpus)
        if not job.todo:
            job.writer.close()  # a second close does nothing
    if not job.todo:
        return job.summary
    if hooks is None:
        engine = start_engine(cfg, model, job)
        gate, close = None, True
    else:  # an online run's epochs share one engine: its hooks start it once and close it
        engine = hooks.open_engine(lambda: start_engine(cfg, model, job))
        gate, close = hooks.gate(engine), False
    return finish(
        cfg, model, corpus, job, *capture(cfg, model, corpus, job, engine, gate, close=close)
    )


def node_layout(cfg: Config) -> NodeLayout:
    """This process's place in its engine. One node unless engine.nnodes is set or
    dist.nodes_per_engine > 1 (then SLURM's step fills what engine.* leaves unset): a SLURM
    allocation of several nodes running one engine per node stays one node per engine."""
    e, want = cfg.engine, cfg.dist.nodes_per_engine
    if want == 1 and e.nnodes is None:
        return find_layout(1, 0, None, env={})
    layout = find_layout(e.nnodes, e.node_rank, e.dist_init_addr)
    if want > 1 and layout.nnodes != want:
        raise Refusal(
            f"dist.nodes_per_engine={want}, but this process's engine spans {layout.nnodes} "
            f"node(s) ({layout.origin}): run it on {want} nodes, one process each "
            "(+dist=slurm_multinode, or srun --nodes=N --ntasks-per-node=1), or set "
            "engine.nnodes/node_rank/dist_init_addr on every node"
        )
    return layout


def follow_node(cfg: Config, model: Model, layout, t0: float) -> Summary:
    """A node after node 0 of an engine over several nodes: its SGLang schedulers only, until
    node 0 is done (node 0 tokenizes, captures and writes)."""
    log.info(
        "node %d of %d (%s): running this node's share of the engine for node 0 at %s",
        layout.node_rank,
        layout.nnodes,
        layout.origin,
        layout.dist_init_addr,
    )
    if cfg.engine.kind == DRY:
        log.info("engine=dry: node %d has no engine share to run", layout.node_rank)
        return Summary(out_dir=cfg.output.dir, layers=model.layers, wall_s=time.time() - t0)
    with sglang_output(sglang_verbose(cfg.engine.log_level)):
        from hsdump.capture.engine import follow  # the sglang import happens only now

        follow(
            model.path,
            cfg.model,
            cfg.engine,
            model.layers,
            model.info,
            cfg.capture.final,
            run_dir=cfg.output.dir,
            job_tag=writer_tag(cfg.dist.num_jobs, cfg.dist.job_index),
            on_ready=log.info,
        )
    log.info("node %d: node 0 is done", layout.node_rank)
    return Summary(out_dir=cfg.output.dir, layers=model.layers, wall_s=time.time() - t0)


def check_model(cfg: Config) -> Model:
    """Refusals that need only the config and the model's config.json; the capture layers."""
    if cfg.dist.num_jobs > 1 and cfg.output.overwrite:
        raise Refusal(
            f"output.overwrite=true with dist.num_jobs={cfg.dist.num_jobs}: each job would delete "
            "the shards the others already wrote. Empty output.dir once, then launch the jobs "
            "without output.overwrite"
        )
    path = resolve_model_path(cfg.model.path)
    check_model_path(cfg.model.path, path)
    info = read_model_info(path, cfg.model.trust_remote_code)
    # the class's check holds for the SGLang release it ran on; engine=dry runs no SGLang
    family = check_verified(
        info.architecture,
        cfg.capture.allow_unverified,
        **({"sglang_version": None} if cfg.engine.kind == DRY else {}),
    )
    # each drafter kind's layers (its default for the depth, or given); their union unless
    # capture.layers says which; DFlash/DSpark only on classes whose serving ids were checked
    layers, _ = capture_layers(cfg.capture, cfg.model.default_layers, info.num_hidden_layers)
    check_kinds(
        info.architecture,
        cfg.capture.kinds,
        cfg.capture.allow_unverified,
        **({"sglang_version": None} if cfg.engine.kind == DRY else {}),
    )
    check_length_limit(cfg, info)
    log.info(
        "model: %s (%s, %d layers, hidden %d), name %s, capturing layers %s%s -> %s",
        path,
        info.architecture,
        info.num_hidden_layers,
        info.hidden_size,
        cfg.model.name,
        layers,
        "".join(f" + {k}" for k in cfg.capture.final),
        cfg.output.dir,
    )
    return Model(path, info, family, layers)


def with_length_limit(cfg: Config, info: ModelInfo) -> Config:
    """cfg with dataset.max_seq_len resolved (length_limit), logged with its origin."""
    n, origin = length_limit(cfg, info)
    log.info("length limit: %d tokens a sample (%s)", n, origin)
    if n == cfg.dataset.max_seq_len:
        return cfg
    return dataclasses.replace(cfg, dataset=dataclasses.replace(cfg.dataset, max_seq_len=n))


def tokenize(cfg: Config, model: Model) -> Corpus:
    """The tokenizer (checked), the dataset's rows, and every row to a sample or a skip."""
    tok = load_tokenizer(cfg.model, model.path)
    info = model.info
    template = (
        f"model.chat_template={cfg.model.chat_template}"
        if cfg.model.chat_template
        else "the tokenizer's own chat template"
    )
    check_tokenizer(
        tok,
        vocab_size=info.vocab_size,
        bos_token_id=info.bos_token_id,
        eos_token_ids=info.eos_token_ids,
        template_source=template,
    )
    log.info(
        "tokenizer: %s (%s tokens), %s",
        cfg.model.tokenizer or "the model's own",
        f"{len(tok):,}",
        template if chat_template_of(tok) else "no chat template",
    )
    rows = load_rows(cfg.dataset)
    # refused from the columns, before the whole dataset is tokenized
    if cfg.regenerate.enabled and detect_format(rows, cfg.dataset)[0] == "text":
        raise Refusal(
            f"regenerate.turns={cfg.regenerate.turns} needs conversations; "
            f"{cfg.dataset.path} is read as plain text (dataset.format=text). Use a "
            "chat dataset, or regenerate.turns=none"
        )
    data = tokenize_dataset(rows, tok, cfg.dataset, progress=cfg.progress)
    if not data.ids:
        raise Refusal(f"no usable sample in {cfg.dataset.path} (skipped: {data.skipped})")
    return Corpus(tok, rows, data)


def dataset_keys(
    cfg: Config, model: Model, corpus: Corpus, resolved_config: Optional[dict]
) -> Manifest:
    """The run-level facts and what a resumed run must agree on (its resume key)."""
    info, data, layers, family = model.info, corpus.data, model.layers, model.family
    fingerprint = content_fingerprint(cfg.dataset, corpus.rows)
    template = template_sha256(corpus.tok)
    key = ResumeKey(
        model=cfg.model.path,
        architecture=info.architecture,
        hidden_size=info.hidden_size,
        num_hidden_layers=info.num_hidden_layers,
        layers=layers,
        final=list(cfg.capture.final),
        storage_dtype=cfg.output.dtype,
        model_dtype=cfg.model.dtype,
        tokenizer=cfg.model.tokenizer or cfg.model.path,
        chat_template_sha256=template,
        # the rows' content, not their path: an edited file is refused, the same file by
        # another path resumes (a dataset written before keeps its path key: legacy_dataset_key)
        dataset=legacy_dataset_key(cfg) or [fingerprint],
        max_seq_len=cfg.dataset.max_seq_len,
        truncation=cfg.dataset.truncation,
        min_seq_len=cfg.dataset.min_seq_len,
        format=data.format,
        # absent when off: older datasets still resume
        regenerate=cfg.regenerate.key() if cfg.regenerate.enabled else None,
        # a real run never resumes (mixes its rows into) a dry dataset
        engine=DRY if cfg.engine.kind == DRY else None,
    )
    return Manifest(
        model=ModelFacts(
            path=cfg.model.path,
            resolved_path=model.path,
            architecture=info.architecture,
            hidden_size=info.hidden_size,
            num_hidden_layers=info.num_hidden_layers,
            dtype=cfg.model.dtype,
            tp_size=cfg.model.tp_size,
            family=family.name if family else None,
            verified=family.verified if family else None,
        ),
        layers=layers,
        resume_key=key,
        storage_dtype=cfg.output.dtype,
        final=list(cfg.capture.final),
        engine=cfg.engine.kind,
        kinds=manifest_kinds(
            cfg.capture,
            cfg.model.default_layers,
            info.architecture,
            info.num_hidden_layers,
            None if cfg.engine.kind == DRY else installed_sglang(),
        ),
        source=Source(
            tokenizer={
                "path": cfg.model.tokenizer or model.path,
                "chat_template_sha256": template,
            },
            dataset={
                "path": cfg.dataset.path,
                "name": cfg.dataset.name,
                "split": cfg.dataset.split,
                "revision": cfg.dataset.revision,
                "fingerprint": fingerprint,
                "rows": data.rows,
                "column": cfg.dataset.column,
                "skipped_rows": data.skipped,
            },
            max_seq_len=cfg.dataset.max_seq_len,
            truncation=cfg.dataset.truncation,
            tokenized=data.summary(),
            regenerate=cfg.regenerate.key(),
            config=resolved_config if resolved_config is not None else dataclasses.asdict(cfg),
        ),
        planned=len(data.ids),  # all jobs' samples: each job tokenizes every row
    )


def legacy_dataset_key(cfg: Config) -> Optional[list]:
    """The resume key's `dataset` of a dataset in output.dir written before the key held the
    rows' content ([path, name, split, revision, column]) when this run names the same source:
    such a dataset resumes as it did (its manifest records no content fingerprint to compare)."""
    from hsdump.store.commits import read_manifest

    try:
        key = (read_manifest(Path(cfg.output.dir)).get("resume_key") or {}).get("dataset")
    except (OSError, ValueError):
        return None
    d = cfg.dataset
    old = [d.path, d.name, d.split, d.revision, d.column]
    return old if key == old else None


def _slots(cfg: Config, layers: List[int]) -> int:
    return len(layers) + len(cfg.capture.final)


def open_dataset(cfg: Config, model: Model, corpus: Corpus, manifest: Manifest, t0: float) -> Job:
    """The writer (resuming what is committed), this job's samples left to do, and the disk
    space check. When nothing is left to do, `todo` is empty and the writer closed."""
    d, data, info = cfg.dist, corpus.data, model.info
    # rows in flight are held once (bf16/fp16/fp32 as the engine runs) until written
    slots = _slots(cfg, model.layers)
    row_bytes = slots * info.hidden_size * STORAGE_BYTES[cfg.model.dtype]
    inflight = rows_in_flight(
        cfg.output, cfg.engine.inflight_tokens, cfg.dataset.max_seq_len, row_bytes
    )
    writer = DatasetWriter(
        cfg.output.dir,
        manifest,
        shard_bytes=cfg.output.shard_bytes,
        overwrite=cfg.output.overwrite,
        on_nonfinite=cfg.output.on_nonfinite,
        writer_tag=writer_tag(d.num_jobs, d.job_index),
        threads=cfg.output.writer_threads,
    )
    if not cfg.regenerate.enabled:  # regenerated answers are counted when the job ends
        write_token_freq(data, cfg.output.dir, target_vocab_size=info.vocab_size)
    done = writer.done_ids()
    mine = [i for i, sid in enumerate(data.ids) if owns(sid, d.num_jobs, d.job_index)]
    todo = [i for i in mine if data.ids[i] not in done]
    summary = Summary(
        out_dir=cfg.output.dir,
        layers=model.layers,
        skipped=dict(data.skipped),
        already_done=len(mine) - len(todo),
        engine=cfg.engine.kind,
        truncated=data.truncated,
        max_seq_len=cfg.dataset.max_seq_len,
    )
    job = Job(writer, todo, sum(data.lengths[i] for i in todo), inflight, summary, t0)
    need = job.todo_tokens * (slots * (info.hidden_size * STORAGE_BYTES[cfg.output.dtype] + 4) + 16)
    try:
        check_space(cfg.output.dir, need + (need >> 6), cfg.output.space_check)
    except BaseException:
        writer.close(commit=False)
        raise
    if not todo:
        writer.close()
        log.info("nothing to do: all %d samples are committed", len(data.ids))
        summary.wall_s = time.time() - t0
    return job


def start_engine(cfg: Config, model: Model, job: Job) -> Engine:
    """SGLang's engine with the capture patch, its own output hidden unless asked for; or, with
    engine=dry, hsdump.capture.dry's engine (no SGLang)."""
    verbose = sglang_verbose(cfg.engine.log_level)
    engine_cfg = dataclasses.replace(
        cfg.engine,
        inflight_tokens=job.inflight,
        log_level=cfg.engine.log_level if verbose else "error",
    )
    dry = cfg.engine.kind == DRY
    if dry:
        log.info(
            "engine: dry (engine=dry): no SGLang; the rows are a function of the token ids, not "
            "the model's hidden states (export and the loader refuse them unless asked)"
        )
    else:
        log.info(
            "engine: starting SGLang %s on %s, tp_size %d%s",
            versions()["sglang"],
            cfg.engine.device,
            cfg.model.tp_size,
            "" if verbose else " (its own log: engine.log_level=info)",
        )
    t = time.time()
    try:
        with contextlib.nullcontext() if dry else sglang_output(verbose):
            spec = CaptureSpec(
                model_path=model.path,
                model=cfg.model,
                engine=engine_cfg,
                layers=tuple(model.layers),
                info=model.info,
                final=tuple(job.writer.final),
                generates=cfg.regenerate.enabled,
                run_dir=cfg.output.dir,
                job_tag=writer_tag(cfg.dist.num_jobs, cfg.dist.job_index),
            )
            fault("engine_start")  # the kill point of a run whose engine is starting
            engine: Engine = open_engine(spec)
    except BaseException:
        job.writer.close(commit=False)
        raise
    job.summary.engine_start_s = time.time() - t
    return engine


def capture(
    cfg: Config, model: Model, corpus: Corpus, job: Job, engine: Engine, gate=None, close=True
):
    """Every sample left to do through the engine into the writer, with a progress bar; the
    engine awaits `gate` (hsdump.capture.base.Gate) before each request, and is closed at the
    end unless `close` is false (its owner closes it).
    Returns (completed, stop signal name or None, EngineDied or None)."""
    from tqdm import tqdm

    data, writer, summary = corpus.data, job.writer, job.summary
    log.info(
        "capture: %d samples (%s tokens) to go, %d already committed; engine started in %.1f s",
        len(job.todo),
        f"{job.todo_tokens:,}",
        summary.already_done,
        summary.engine_start_s,
    )
    took = getattr(engine, "max_prompt_tokens", None)
    if took is not None and took < cfg.dataset.max_seq_len:  # its KV pool came out smaller
        log.warning(
            "the engine takes prompts of at most %d tokens (its own figure), fewer than the "
            "length limit %d: longer samples are bad rows (%s); a larger KV pool takes them "
            "(engine.max_total_tokens, or a higher engine.mem_fraction_static), or lower "
            "dataset.max_seq_len",
            took,
            cfg.dataset.max_seq_len,
            REFUSED,
        )
    bar = tqdm(total=len(job.todo), unit="sample", disable=not cfg.progress, dynamic_ncols=True)
    t_run = time.time()
    first: List[tuple] = []  # check.logprob_samples: the first samples captured (id, input_ids)

    def sink(s: CapturedSample) -> None:
        fault("sample")
        if len(first) < cfg.check.logprob_samples:
            first.append((s.sid, list(s.input_ids)))
        # the engine checked NaN/Inf on the device: the writer does not scan the rows again
        if writer.add_sample(s):
            summary.tokens += len(s.input_ids)
        bar.update(1)
        el = max(time.time() - t_run, 1e-9)
        bar.set_postfix_str(
            f"{summary.tokens / el:,.0f} tok/s, {writer.bytes_written / 2**20:,.0f} MiB written",
            refresh=False,
        )

    def refused(sid: int, message: str) -> None:
        # a bad row: recorded (a resumed run goes past it), counted, the others go on
        writer.skip(sid, f"{REFUSED}: {message}", count_as=REFUSED)
        log.warning("sample %d is a bad row (%s): %s", sid, REFUSED, message)
        bar.update(1)

    signals: Dict[str, str] = {}

    def on_signal(name: str) -> None:
        if signals.get("seen"):
            log.warning("%s again: stopping at once", name)
            engine.abort()
            return
        signals["seen"] = name
        log.warning(
            "%s: finishing the samples in flight, then committing and stopping "
            "(send it again to stop at once)",
            name,
        )
        engine.request_stop()

    ok, died, logprobs = False, None, {}
    try:
        if not cfg.regenerate.enabled:
            samples = (Request(data.ids[i], data.input_ids[i], data.loss_mask[i]) for i in job.todo)
            gated = {} if gate is None else {"gate": gate}  # engines without gates still run
            ok = engine.run(samples, sink, on_signal, refused=refused, **gated)
        else:
            ok = regenerate_and_capture(cfg, corpus, job, engine, sink, on_signal, bar, refused)
        if ok and first:  # before the engine closes: SGLang's own logprobs of those samples
            from hsdump.check_final import engine_logprobs

            logprobs = engine_logprobs(engine, first, on_signal)
    except EngineDied as e:
        died = e
    except KeyboardInterrupt:
        ok, signals["seen"] = False, signals.get("seen", "SIGINT") + " twice"
    finally:
        bar.close()
        try:
            if close:
                engine.close()
        finally:
            t = time.time()
            writer.close(commit=True)
            log.info(
                "commit: %d samples, %s bytes in %s (final flush %.1f s)",
                writer.samples_written,
                f"{writer.bytes_written:,}",
                cfg.output.dir,
                time.time() - t,
            )
    if logprobs:  # hsdump.check_final: logged, and final_check/<writer>.json
        from hsdump.check_final import report

        report(cfg.output.dir, writer.tag, model.path, logprobs)
    return ok, signals.get("seen"), died


def regenerate_and_capture(
    cfg: Config, corpus: Corpus, job: Job, engine, sink, on_signal, bar, refused=None
) -> bool:
    """`regenerate.window` samples at a time: the target model rewrites their answers
    (hsdump.corpus.regenerate), each rewritten conversation becomes a sample under the dataset's length
    policy, and those are captured and committed with their conversations. False if stopped."""
    from hsdump.corpus.chat import chat_template_of
    from hsdump.corpus.formats import BadRow, dataset_record, row_to_sample
    from hsdump.corpus.regenerate import regenerate, to_sample
    from hsdump.corpus.tokenization import Skip

    data, summary, tok = corpus.data, job.summary, corpus.tok
    template = chat_template_of(tok)

    def generate(reqs):
        t = time.time()
        out = engine.generate(reqs, on_signal)
        summary.generate_s += time.time() - t
        summary.generated_tokens += sum(len(v.get("output_ids") or ()) for v in out.values())
        return out

    step = cfg.regenerate.window
    for k in range(0, len(job.todo), step):
        window = [data.ids[i] for i in job.todo[k : k + step]]
        items = []
        for sid in window:
            messages, tools = row_to_sample(
                dataset_record(corpus.rows[sid]), data.format, data.column
            )
            items.append((sid, messages, tools))
        new = regenerate(items, tok, template, cfg.regenerate, generate)
        if engine.stop_requested:
            return False
        batch = []
        for sid, _, tools in items:
            try:
                ids, mask = to_sample(tok, template, new[sid], tools, cfg.dataset)
            except (Skip, BadRow) as e:  # recorded: a resumed run does not generate it again
                reason = f"{e.reason} after regeneration"
                job.writer.skip(sid, reason)  # counted in writer.skipped, summed by finish()
                bar.update(1)
                continue
            batch.append(Request(sid, ids, mask, conversation=new[sid]))
        if not engine.run(batch, sink, on_signal, refused=refused):
            return False
    return True


def finish(
    cfg: Config, model: Model, corpus: Corpus, job: Job, ok: bool, stopped_by: Optional[str], died
) -> Summary:
    """The summary; an engine that died or a stop signal raise Interrupted (committed is safe)."""
    writer, summary = job.writer, job.summary
    summary.written = writer.samples_written
    summary.bytes = writer.bytes_written
    for k, v in writer.skipped.items():
        summary.skipped[k] = summary.skipped.get(k, 0) + v
    summary.wall_s = time.time() - job.t0
    resume = (
        f"{writer.samples_written} samples were committed in this run and are safe; "
        "run the same command again to resume."
    )
    if cfg.regenerate.enabled and writer.samples_written + summary.already_done:
        # the stored answers are the model's, not the source's: count what was committed,
        # once, by the job whose end completes the dataset
        t = time.time()
        path, left = count_if_complete(
            cfg.output.dir, corpus.data.ids, target_vocab_size=model.info.vocab_size
        )
        if path is not None:
            log.info(
                "token_freq.json: counted over the committed samples in %.1f s", time.time() - t
            )
        else:
            log.info(
                "token_freq.json: not counted yet: %d of the dataset's %d samples are "
                "not committed (other jobs', or this run's if it stopped); the job that "
                "completes the dataset counts them, and `hsdump vocab` counts what is "
                "committed if it runs before that",
                left,
                len(corpus.data.ids),
            )
    if died is not None:
        raise Interrupted(f"the SGLang engine died: {died}. {resume}") from died
    if not ok:
        raise Interrupted(f"stopped by {stopped_by or 'request'}. {resume}")
    n_refused = writer.skipped.get(REFUSED, 0)
    if n_refused and cfg.dataset.on_bad_row == "raise":
        raise Refusal(
            f"{n_refused} bad row(s): the engine refused them ({REFUSED}; each one's id and "
            f"SGLang's message are in the log above and in the commit log). The other "
            f"{writer.samples_written} samples of this run are committed, and the refused ones "
            "are recorded as skipped: the same command resumes past them. Set "
            "dataset.on_bad_row=skip to count such rows and end with status 0"
        )
    return summary
