"""hsdump.store.manifest: one Manifest built, written, read and validated in one place; the
reader and `hsdump verify` judge a manifest by the same validator; a partial dataset (an
interrupted run's) is said by inspect and verify and refused by export unless asked (issue 42,
case 7, on the dry engine)."""

import json

import pytest
from factories import LAYERS, H, committed, patch_manifest, rows_manifest, sample
from harness import DRY, extract

from hsdump.store.manifest import Manifest, ResumeKey, problems, progress
from hsdump.store.reader import HsdumpDataset
from hsdump.store.writer import DatasetWriter
from hsdump.tools import export as ex
from hsdump.tools import inspect, verify

ARGS = [
    "dataset.max_samples=12",
    "dataset.max_seq_len=64",
    "output.shard_bytes=40000",
    "output.writer_threads=1",
    "dataset.on_bad_row=skip",
    "capture.final=[pre_norm]",
    DRY,
]


def small(path, manifest=None, sids=(0, 1, 2)):
    w = DatasetWriter(str(path), manifest or rows_manifest())
    for sid in sids:
        w.add(sid, *sample(sid, 4))
    w.close()
    return path


def test_the_written_manifest_reads_back_as_the_same_manifest(tmp_path):
    m = rows_manifest(storage_dtype="fp8", planned=7)
    small(tmp_path, m)
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == m.to_json()
    assert on_disk["resume_key"] == {
        "model": "m",
        "hidden_size": H,
        "num_hidden_layers": 8,
        "layers": LAYERS,
        "final": [],
        "storage_dtype": "fp8",
    }
    back = Manifest.read(tmp_path)
    assert back.to_json() == on_disk and back.planned == 7 and back.source is None
    # kinds: left out when None, kept when given
    assert "kinds" not in on_disk
    assert Manifest.from_json({**on_disk, "kinds": {"eagle3": [2]}}).kinds == {"eagle3": [2]}


def test_old_manifests_read_and_say_their_plan_by_tokenized_samples():
    """A manifest written before `planned` (or before family/verified and engine) reads; its
    plan is tokenized.samples, the same count; one of rows from no source has no plan."""
    old = {
        "format": "hsdump/speculators-v1",
        "format_version": 1,
        "layers": [2, 4],
        "storage_dtype": "bfloat16",
        "model": {"path": "x", "hidden_size": 16, "num_hidden_layers": 6},
        "tokenized": {"samples": 40},
        "resume_key": {"model": "x", "layers": [2, 4]},
    }
    m = Manifest.from_json(old)
    assert m.planned == 40 and m.engine == "sglang" and m.model.family is None
    assert progress(old, 30, 2).line() == (
        "partial: 30 of 40 samples committed (2 refused), 8 not written yet; resume with the "
        "same command"
    )
    assert progress(old, 38, 2).complete and progress(old, 38, 2).line() == ""
    assert progress({**old, "tokenized": None}, 3, 0).complete is None


def test_refused_samples_count_as_done(tmp_path):
    """A sample the writer refused (a skipped record) is not written again: the dataset is
    complete once every planned sample is committed or refused."""
    w = DatasetWriter(str(tmp_path), rows_manifest(planned=4))
    for sid in (0, 1):
        w.add(sid, *sample(sid, 4))
    w.skip(2, "nonfinite in hidden_states[0]")
    w.close()
    pg = HsdumpDataset(str(tmp_path)).progress
    assert (pg.committed, pg.refused, pg.planned, pg.complete) == (2, 1, 4, False)
    assert pg.line() == (
        "partial: 2 of 4 samples committed (1 refused), 1 not written yet; resume with the "
        "same command"
    )
    small(tmp_path, rows_manifest(planned=4), sids=(3,))
    assert HsdumpDataset(str(tmp_path)).progress.complete


def test_a_resumed_run_that_plans_more_sets_planned(tmp_path):
    """A larger dataset.max_samples resumes (the resume key allows it): manifest.json's
    planned becomes the resumed run's, the one key rewritten on resume."""
    small(tmp_path, rows_manifest(planned=3), sids=(0, 1, 2))
    assert HsdumpDataset(str(tmp_path)).progress.complete
    before = json.loads((tmp_path / "manifest.json").read_text())
    small(tmp_path, rows_manifest(planned=5), sids=(3,))
    after = json.loads((tmp_path / "manifest.json").read_text())
    assert after == {**before, "planned": 5}
    assert HsdumpDataset(str(tmp_path)).progress.line().startswith("partial: 4 of 5 samples")


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"model": {"path": "m"}}, "model.hidden_size is None, not a positive int"),
        ({"model": {"hidden_size": "8"}}, "model.hidden_size is '8', not a positive int"),
        ({"layers": [2, 2]}, "layers is [2, 2], not a list of 1 to 1024 distinct layer indices"),
        ({"storage_dtype": "int8"}, "storage_dtype is 'int8'; expected one of"),
        ({"final": ["pre_norm", "mid"]}, "final is ['pre_norm', 'mid'], not a list of distinct"),
        ({"planned": -1}, "planned is -1, not a sample count"),
        ({"engine": "vllm"}, "engine is 'vllm', not one of ['sglang', 'dry']"),
    ],
)
def test_the_reader_and_verify_judge_a_manifest_alike(tmp_path, change, problem):
    small(tmp_path)
    m = patch_manifest(tmp_path, **change)
    (first,) = problems(m)
    assert first.startswith(problem)
    with pytest.raises(ValueError) as e:
        HsdumpDataset(str(tmp_path))
    assert f"manifest.json's {first}" in str(e.value)
    r = verify.verify(str(tmp_path), quick=True)
    assert [p.what for p in r.problems if p.where == "manifest.json"] == [first]


def test_the_writer_takes_a_manifest_only_and_refuses_a_bad_one(tmp_path):
    with pytest.raises(TypeError, match="takes a hsdump.store.manifest.Manifest"):
        DatasetWriter(str(tmp_path), {"layers": LAYERS})
    with pytest.raises(ValueError, match="storage_dtype is 'int4'"):
        rows_manifest(storage_dtype="int4")
    assert not (tmp_path / "manifest.json").exists()


def test_a_resume_key_names_what_differs():
    key = rows_manifest().resume_key
    assert key.diff(key.to_json()) == []
    assert key.diff({**key.to_json(), "layers": [1]}) == [f"layers: [1] -> {LAYERS}"]
    dry = ResumeKey(**{**key.__dict__, "engine": "dry"})
    (line,) = dry.diff(key.to_json())
    assert line.startswith("engine: None -> 'dry' (engine=dry rows and a real engine's")


def test_an_interrupted_run_is_said_partial_and_export_refuses_it(tmp_path, capsys):
    """Issue 42, case 7: after an interrupted run, inspect and verify say 'N of M samples,
    resume with the same command'; export refuses unless --allow-partial and then records
    complete: false with the counts; the same command completes it."""
    out = tmp_path / "ds"
    rc, log = extract(out=out, args=ARGS, fault="sample@5:TERM")  # stopped after 5 samples
    assert rc == 3, log[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    planned = m["planned"]
    assert planned == m["tokenized"]["samples"] > (n := len(committed(out))) >= 4
    want = f"{n} of {planned} samples committed, {planned - n} not written yet; resume with the "

    r = verify.verify(str(out))
    assert r.ok and r.partial and r.progress["planned"] == planned
    assert r.lines()[-1] == f"PARTIAL: {want}same command"
    assert verify.main([str(out)]) == 0  # valid: a clean partial dataset is not a failure
    capsys.readouterr()
    assert verify.main([str(out), "--complete"]) == 1
    text = capsys.readouterr().out  # its verdict says so: no "OK:" before exit 1 (issue 51)
    assert "\nFAILED (--complete: the dataset is partial): " in text and "OK:" not in text, text
    assert inspect.main([str(out)]) == 0
    text = capsys.readouterr().out
    assert f"samples          {n} of {planned} planned (partial)" in text
    assert f"PARTIAL          {want}same command" in text

    dest = tmp_path / "export"
    with pytest.raises(ex.ExportError) as e:
        ex.export(str(out), str(dest), "speculators-v1", allow_dry=True, progress=False)
    assert f"is partial: {want}" in str(e.value) and "--allow-partial" in str(e.value)
    assert not dest.exists()
    c = ex.export(
        str(out),
        str(dest),
        "speculators-v1",
        allow_dry=True,
        allow_partial=True,
        progress=False,
    )
    assert c["written"] == n
    state = json.loads((dest / ex.STATE).read_text())
    assert state["finished"] and state["complete"] is False
    assert (state["source_samples"], state["source_planned"]) == (n, planned)

    rc, log = extract(out=out, args=ARGS)  # the same command resumes and completes it
    assert rc == 0, log[-3000:]
    r = verify.verify(str(out))
    assert r.ok and not r.partial and r.progress["complete"] and r.partial_line == ""
    assert verify.main([str(out), "--complete"]) == 0
    assert inspect.gather(str(out))[0]["partial"] is None
    ds = HsdumpDataset(str(out), allow_dry=True)
    assert ds.progress.done == planned
    dest2 = tmp_path / "export2"
    ex.export(str(out), str(dest2), "speculators-v1", allow_dry=True, progress=False)
    state = json.loads((dest2 / ex.STATE).read_text())
    assert state["complete"] is True and state["source_samples"] == len(ds) == planned
