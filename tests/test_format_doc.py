"""docs/format.md and docs/schema/ against what hsdump writes, and against each other.

Two real datasets are written through the extraction's own steps (hsdump.pipeline: the
manifest and resume key, the writer, the capture sink, the end-of-run token counts), with a
stand-in for the SGLang engine that returns random rows:
  - `two_jobs`: jobs 0 and 1 of 2 sharing one folder, fp8 storage with the final pre-norm
    state, a sample refused for NaN/Inf (a skipped record), and job 0 stopped after three
    samples and resumed, so its log holds the records of two runs;
  - `regenerated`: one job (`main`) with regenerated answers: conversations in the shard
    metadata, a sample skipped after regeneration, token_freq.json counted over the committed
    samples, then `hsdump vocab`'s mapping.
Every JSON file (index.json, manifest.json, token_freq.json, each commit log line) and each
shard's and the vocab mapping's safetensors metadata is validated against its schema in
docs/schema/. Then every JSON example of docs/format.md (a ```json or ```jsonl block right
after a `<!-- schema: NAME -->` comment; NAME is docs/schema/NAME.schema.json) is validated
against its schema, so neither the code nor the document can drift from the schemas unseen.
No GPU, no engine: a few seconds.
"""

import functools
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from safetensors import safe_open

from hsdump import pipeline
from hsdump.capture.base import CapturedSample
from hsdump.capture.families import check_verified
from hsdump.capture.layers import ModelInfo
from hsdump.config import (
    CaptureConfig,
    Config,
    DatasetConfig,
    DistConfig,
    ModelConfig,
    OutputConfig,
    RegenerateConfig,
)
from hsdump.corpus.tokenization import Tokenized
from hsdump.tools import vocab

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "format.md"
SCHEMAS = ROOT / "docs" / "schema"
H, LAYERS, ROWS, VOCAB = 16, [1, 3, 4], 20, 64
MARK = re.compile(r"<!--\s*schema:\s*([\w-]+)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")


# ---------------------------------------------------------------------- schemas and checks
@functools.lru_cache(maxsize=None)
def schemas() -> dict:
    out = {}
    for p in sorted(SCHEMAS.glob("*.schema.json")):
        s = json.loads(p.read_text())
        jsonschema.Draft202012Validator.check_schema(s)
        out[p.name[: -len(".schema.json")]] = jsonschema.Draft202012Validator(s)
    return out


def check(name: str, obj, where: str) -> None:
    """`obj` satisfies schema `name`, and what a schema cannot say (columns that agree)."""
    errors = sorted(schemas()[name].iter_errors(obj), key=lambda e: list(e.absolute_path))
    assert not errors, f"{where} does not match docs/schema/{name}.schema.json:\n" + "\n".join(
        map(_why, errors[:10])
    )
    if name == "index":
        sh, sa = obj["shards"], obj["samples"]
        assert len({len(sh[k]) for k in sh}) == 1, f"{where}: shard columns differ in length"
        assert len({len(sa[k]) for k in sa}) == 1, f"{where}: sample columns differ in length"
        assert sum(sh["count"]) == len(sa["id"]), f"{where}: sum(count) != len(samples.id)"
        assert all(m <= n for m, n in zip(sa["masked"], sa["length"])), where
    if name == "commit-record" and "shard" in obj:
        assert len(obj["ids"]) == len(obj["lengths"]) == len(obj["masked"]), where
    if name == "token_freq":
        assert obj["loss_tokens"] == sum(obj["counts"].values()), where
        assert obj["distinct"] == len(obj["counts"]), where
    if name == "index-v1":
        for sid, shard in obj["samples"].items():
            assert shard in obj["shards"], f"{where}: sample {sid} names an unlisted shard"


def _why(e) -> str:
    """One line per error; for oneOf (shard or skipped record), the branch that came closest."""
    if e.context:
        e = jsonschema.exceptions.best_match(e.context)
    return f"  at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"


# ---------------------------------------------------------------------- writing datasets
def tokenized(skip_rows=(4, 13)) -> Tokenized:
    ids, inp, mask = [], [], []
    for sid in range(ROWS):
        if sid in skip_rows:
            continue
        n = 3 + sid % 7
        ids.append(sid)
        inp.append([(sid * 7 + k) % 50 for k in range(n)])
        mask.append([0] * (n // 2) + [1] * (n - n // 2))
    return Tokenized(
        ids=ids,
        input_ids=inp,
        loss_mask=mask,
        skipped={"too_long": 1, "no_assistant_tokens": 1},
        rows=ROWS,
        truncated=2,
        format="messages",
        column="messages",
        mask_source="generation_markers",
        source={"kind": "jsonl", "records": ROWS},
        tokens=sum(map(len, inp)),
        loss_tokens=sum(map(sum, mask)),
        lengths=[len(x) for x in inp],
    )


class Engine:
    """The SGLang engine's part for capture(): random rows, one sample flagged NaN/Inf, and a
    stop after `stop_after` samples (as a signal would)."""

    def __init__(self, final, stop_after=None, nonfinite=()):
        self.final, self.stop_after, self.nonfinite = list(final), stop_after, set(nonfinite)

    def run(self, items, sink, on_signal, refused=None):
        for k, req in enumerate(items):
            sid, ids = req.sid, req.input_ids
            if self.stop_after is not None and k >= self.stop_after:
                return False
            g = torch.Generator().manual_seed(sid)
            rows = [
                torch.randn(len(ids), H, generator=g) for _ in range(len(LAYERS) + len(self.final))
            ]
            final = dict(zip(self.final, rows[len(LAYERS) :]))
            bad = [0] if sid in self.nonfinite else []
            sink(CapturedSample(sid, ids, req.loss_mask, rows[: len(LAYERS)], final, bad))
        return True

    def close(self):
        pass


def job(out: Path, *, num_jobs=1, job_index=0, dtype="bfloat16", final=(), turns="none"):
    """A run's state after its steps up to the engine: manifest written, writer open."""
    cfg = Config(
        model=ModelConfig(path="org/tiny-model"),
        dataset=DatasetConfig(path="rows.jsonl", max_seq_len=64),
        capture=CaptureConfig(layers=LAYERS, final=list(final)),
        regenerate=RegenerateConfig(turns=turns),
        output=OutputConfig(
            dir=str(out),
            shard_bytes=4000,
            dtype=dtype,
            on_nonfinite="skip",
            max_host_bytes=1 << 20,
            writer_threads=2,
            space_check="off",
        ),
        dist=DistConfig(num_jobs=num_jobs, job_index=job_index),
        progress=False,
    )
    info = ModelInfo("LlamaForCausalLM", H, 6, 512, vocab_size=VOCAB)
    model = pipeline.Model(
        "/models/tiny-model", info, check_verified(info.architecture, False), LAYERS
    )
    corpus = pipeline.Corpus(
        SimpleNamespace(chat_template="{{ messages }}"), [{}] * ROWS, tokenized()
    )
    manifest = pipeline.dataset_keys(cfg, model, corpus, None)
    j = pipeline.open_dataset(cfg, model, corpus, manifest, time.time())
    assert j.todo
    return SimpleNamespace(
        cfg=cfg, model=model, corpus=corpus, job=j, data=corpus.data, todo=j.todo, writer=j.writer
    )


def captured(r, engine) -> None:
    pipeline.finish(
        r.cfg, r.model, r.corpus, r.job, *pipeline.capture(r.cfg, r.model, r.corpus, r.job, engine)
    )


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_jobs")
    kw = dict(num_jobs=2, dtype="fp8", final=["pre_norm"])
    r = job(out, job_index=0, **kw)
    with pytest.raises(pipeline.Interrupted, match="stopped"):
        captured(r, Engine(r.cfg.capture.final, stop_after=3))
    first_run = len((out / "commits" / "j0000of0002.jsonl").read_text().splitlines())
    r = job(out, job_index=0, **kw)  # resumes its own log
    captured(r, Engine(r.cfg.capture.final, nonfinite=[12]))
    r = job(out, job_index=1, **kw)
    captured(r, Engine(r.cfg.capture.final))
    return out, first_run


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    out = tmp_path_factory.mktemp("regenerated")
    r = job(out, turns="last")
    data = r.data
    for i in r.todo:
        sid = data.ids[i]
        if sid == 9:
            r.writer.skip(sid, "too_long after regeneration")
            continue
        g = torch.Generator().manual_seed(sid)
        n = len(data.input_ids[i])
        conv = [
            {"role": "user", "content": f"question {sid}"},
            {"role": "assistant", "content": f"answer {sid} ✓"},
        ]
        assert r.writer.add(
            sid,
            data.input_ids[i],
            data.loss_mask[i],
            [torch.randn(n, H, generator=g) for _ in LAYERS],
            conversation=conv,
        )
    r.writer.close()
    pipeline.finish(r.cfg, r.model, r.corpus, r.job, True, None, None)  # the last job counts
    assert vocab.main([str(out), "--draft-vocab-size", "5"]) == 0
    return out


# ---------------------------------------------------------------------- the tests
def check_dataset(out: Path) -> dict:
    """Every JSON file and metadata block of dataset `out` against its schema; what was
    seen, by kind."""
    seen = {"logs": 0, "shard": 0, "skipped": 0, "conversations": 0}
    check("manifest", json.loads((out / "manifest.json").read_text()), f"{out}/manifest.json")
    index = json.loads((out / "index.json").read_text())
    check("index", index, f"{out}/index.json")
    check("token_freq", json.loads((out / "token_freq.json").read_text()), f"{out}/token_freq.json")
    for log in sorted((out / "commits").glob("*.jsonl")):
        seen["logs"] += 1
        for n, line in enumerate(log.read_text().splitlines(), 1):
            rec = json.loads(line)
            check("commit-record", rec, f"{log.name} line {n}")
            seen["shard" if "shard" in rec else "skipped"] += 1
    assert len(index["shards"]["path"]) == seen["shard"]  # compacted: the index covers all
    for path in index["shards"]["path"]:
        with safe_open(str(out / path), framework="pt") as f:
            meta = f.metadata()
        check("shard-metadata", meta, f"{path} __metadata__")
        if "conversations" in meta:
            seen["conversations"] += 1
            check(
                "conversations",
                json.loads(meta["conversations"]),
                f"{path} __metadata__ conversations",
            )
    doc = DOC.read_text()
    for p in out.iterdir():  # every file the code puts in OUT is named in the document
        assert f"`{p.name}" in doc or f" {p.name}" in doc, f"docs/format.md never names {p.name}"
    return seen


def test_a_two_job_resumed_fp8_dataset_matches_the_schemas(two_jobs):
    out, first_run = two_jobs
    seen = check_dataset(out)
    assert seen["logs"] == 2 and seen["skipped"] == 1 and seen["shard"] >= 4
    lines = len((out / "commits" / "j0000of0002.jsonl").read_text().splitlines())
    assert 0 < first_run < lines  # job 0's log holds the records of both its runs
    assert (
        json.loads((out / "token_freq.json").read_text())["counted"]
        == "input_ids where loss_mask == 1"
    )


def test_a_regenerated_dataset_with_a_vocab_mapping_matches_the_schemas(regenerated):
    seen = check_dataset(regenerated)
    assert seen["logs"] == 1 and seen["skipped"] == 1 and seen["conversations"] >= 1
    assert (
        json.loads((regenerated / "token_freq.json").read_text())["counted"]
        == "input_ids where loss_mask == 1, of the committed samples"
    )
    with safe_open(str(regenerated / "vocab_mapping.safetensors"), framework="pt") as f:
        check("vocab-mapping-metadata", f.metadata(), "vocab_mapping.safetensors __metadata__")


def doc_examples(text: str):
    """(schema name or None, fence language, line number, parsed JSON documents) for every
    fenced block of the document; a `<!-- schema: NAME -->` comment marks the block that
    follows it (blank lines between allowed)."""
    lines = text.splitlines()
    out, mark, i = [], None, 0
    while i < len(lines):
        m, f = MARK.fullmatch(lines[i].strip()), FENCE.match(lines[i])
        if m:
            mark = m.group(1)
        elif f:
            j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
            body = lines[i + 1 : j]
            lang = f.group(1)
            docs = []
            if lang == "json":
                docs = [json.loads("\n".join(body))]
            elif lang == "jsonl":
                docs = [json.loads(x) for x in body if x.strip()]
            out.append((mark, lang, i + 1, docs))
            mark, i = None, j
        elif lines[i].strip():
            mark = None
        i += 1
    return out


def test_the_documents_examples_match_the_schemas():
    found = set()
    examples = doc_examples(DOC.read_text())
    for name, lang, line, docs in examples:
        where = f"docs/format.md line {line}"
        if name is None:
            assert lang not in ("json", "jsonl"), (
                f"{where}: a JSON example without a `<!-- schema: NAME -->` comment before it"
            )
            continue
        assert lang in ("json", "jsonl"), f"{where}: schema {name} marks a ```{lang} block"
        assert name in schemas(), f"{where}: no docs/schema/{name}.schema.json"
        assert docs, f"{where}: an empty example"
        for k, obj in enumerate(docs):
            check(name, obj, where + (f" (line {k + 1} of the block)" if lang == "jsonl" else ""))
        found.add(name)
    missing = sorted(set(schemas()) - found)
    assert not missing, f"docs/format.md has no example of {missing}"
