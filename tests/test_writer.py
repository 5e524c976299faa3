import json

import pytest
import torch
from factories import LAYERS, H, committed, rows_manifest, sample, shards, skipped
from safetensors import safe_open

from hsdump.store.reader import HsdumpDataset
from hsdump.store.writer import DatasetWriter, SampleError


def writer(path, **kw):
    args = dict(shard_bytes=2000)
    args.update(kw)
    manifest = args.pop("manifest", None) or rows_manifest()
    return DatasetWriter(str(path), manifest, **args)


def test_round_trip_follows_the_spec(tmp_path):
    w = writer(tmp_path)
    data = {sid: sample(sid, n) for sid, n in [(0, 5), (3, 17), (7, 40), (8, 1)]}
    for sid, (ids, mask, hs) in data.items():
        assert w.add(sid, ids, mask, hs)
    w.close()
    assert sorted(committed(tmp_path)) == [0, 3, 7, 8]
    index = json.loads((tmp_path / "index.json").read_text())  # compacted when it closed
    assert index["format_version"] == 2 and index["covers"] == {
        "main": (tmp_path / "commits" / "main.jsonl").stat().st_size
    }
    # columns: per shard path/bytes/sha256/count, per sample id/length/masked in shard order
    sh, sa = index["shards"], index["samples"]
    assert len(sh["path"]) >= 2 and sum(sh["count"]) == len(sa["id"]) == 4  # 2000-byte shards
    lens = dict([(0, 5), (3, 17), (7, 40), (8, 1)])
    assert sa["length"] == [lens[i] for i in sa["id"]]
    assert sa["masked"] == [n - n // 2 for n in sa["length"]]
    assert shards(tmp_path).keys() == set(sh["path"])
    for name, size in zip(sh["path"], sh["bytes"]):
        assert (tmp_path / name).stat().st_size == size
        with safe_open(str(tmp_path / name), framework="pt") as f:
            m = f.metadata()
            assert m["format"] == "hsdump/speculators-v1" and m["format_version"] == "2"
            assert json.loads(m["layers"]) == LAYERS
            for key in f.keys():
                sid, rest = key.split("/", 1)
                assert rest in (
                    "input_ids",
                    "loss_mask",
                    "hidden_states/0",
                    "hidden_states/1",
                    "hidden_states/2",
                )
    ds = HsdumpDataset(str(tmp_path))
    assert ds.ids == [0, 3, 7, 8] and ds.layers == LAYERS and len(ds) == 4
    for sid, (ids, mask, hs) in data.items():
        r = ds.get(sid)
        assert r["input_ids"].dtype == torch.int64 and r["input_ids"].tolist() == ids
        assert r["loss_mask"].dtype == torch.int64 and r["loss_mask"].tolist() == mask
        for a, b in zip(r["hidden_states"], hs):
            assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)))
    assert batch["id"] == 0


def test_a_shard_missing_from_the_index_is_never_read(tmp_path):
    w = writer(tmp_path, shard_bytes=1 << 30)
    w.add(0, *sample(0, 4))
    w.close()
    # a crash after a rename but before the commit record leaves exactly this: a shard that
    # no record lists. It is garbage and must stay invisible.
    (tmp_path / "shards/main/0000/main-000001.safetensors").write_bytes(b"\x00" * 100)
    (tmp_path / "shards/main/0000/main-000002.safetensors.tmp.h.1.2").write_bytes(b"junk")
    (tmp_path / "shard-00001.safetensors").write_bytes(b"\x00" * 100)
    ds = HsdumpDataset(str(tmp_path))
    assert ds.ids == [0]
    w = writer(tmp_path, shard_bytes=1 << 30)  # resume
    assert w.committed == {0}
    w.add(1, *sample(1, 4))
    w.close()
    assert HsdumpDataset(str(tmp_path)).ids == [0, 1]


def test_resume_refuses_a_different_config_and_names_it(tmp_path):
    w = writer(tmp_path)
    w.add(0, *sample(0, 4))
    w.close()
    with pytest.raises(ValueError) as e:
        writer(tmp_path, manifest=rows_manifest(layers=[1, 2, 3]))
    assert "layers: [2, 4, 5] -> [1, 2, 3]" in str(e.value)
    assert "output.overwrite=true" in str(e.value)
    w = writer(tmp_path, manifest=rows_manifest(layers=[1, 2, 3]), overwrite=True)
    assert w.committed == set()
    w.close()


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no hsdump dataset"):
        writer(tmp_path)


def test_bad_samples_are_never_committed(tmp_path):
    w = writer(tmp_path)
    ids, mask, hs = sample(0, 6)
    with pytest.raises(SampleError, match=r"hidden_states\[1\] has shape \(5, 8\)"):
        w.add(0, ids, mask, [hs[0], hs[1][:5], hs[2]])
    with pytest.raises(SampleError, match="loss_mask has 5 entries"):
        w.add(0, ids, mask[:5], hs)
    bad = [hs[0], hs[1].clone(), hs[2]]
    bad[1][2, 3] = float("nan")
    with pytest.raises(SampleError, match=r"nonfinite in hidden_states\[1\]"):
        w.add(0, ids, mask, bad)
    w.close()
    assert HsdumpDataset(str(tmp_path)).ids == []  # nothing was committed

    w = writer(tmp_path / "skip", on_nonfinite="skip")
    assert not w.add(0, ids, mask, bad)
    assert w.add(1, *sample(1, 3))
    w.close()
    assert list(committed(tmp_path / "skip")) == [1]
    assert skipped(tmp_path / "skip") == {0: "nonfinite in hidden_states[1]"}


def test_producer_flags_replace_the_scan(tmp_path):
    # CaptureEngine checks NaN/Inf on the device and passes the flagged indices: the writer
    # then takes them as the verdict (no second pass over the rows on the CPU)
    w = writer(tmp_path, on_nonfinite="skip", manifest=rows_manifest(final=["post_norm"]))
    ids, mask, hs = sample(0, 6)
    post = torch.randn(6, H)
    assert not w.add(0, ids, mask, hs, {"post_norm": post}, nonfinite=[3])
    assert not w.add(1, ids, mask, hs, {"post_norm": post}, nonfinite=[2, 1])
    assert w.add(2, ids, mask, hs, {"post_norm": post}, nonfinite=[])
    # the flags are the verdict: rows the producer called finite are not scanned again
    nan = [hs[0], hs[1].clone(), hs[2]]
    nan[1][0, 0] = float("nan")
    assert w.add(3, ids, mask, nan, {"post_norm": post}, nonfinite=[])
    w.close()
    assert sorted(committed(tmp_path)) == [2, 3]
    assert skipped(tmp_path) == {
        0: "nonfinite in final/post_norm",
        1: "nonfinite in hidden_states[1]",
    }
    w = writer(tmp_path / "raise")
    with pytest.raises(SampleError, match=r"nonfinite in hidden_states\[0\]"):
        w.add(0, ids, mask, hs, nonfinite=[0])
    with pytest.raises(SampleError, match=r"flags \[3\] name tensors beyond the 3 given"):
        w.add(0, ids, mask, hs, nonfinite=[3])
    w.close()


def test_fp8_storage_and_final_states_round_trip(tmp_path):
    w = writer(tmp_path, manifest=rows_manifest(storage_dtype="fp8", final=["pre_norm"]))
    ids, mask, hs = sample(4, 12)
    pre = torch.randn(12, H) * 30
    w.add(4, ids, mask, hs, {"pre_norm": pre})
    with pytest.raises(SampleError, match="final states"):
        w.add(5, ids, mask, hs)
    w.close()
    r = HsdumpDataset(str(tmp_path)).get(4)
    for a, b in zip(r["hidden_states"] + [r["final"]["pre_norm"]], hs + [pre]):
        err = float((a.float() - b).norm() / b.norm())
        assert 0 < err < 0.05  # e4m3 keeps 3 mantissa bits: a few percent, never exact
    with safe_open(str(tmp_path / next(iter(shards(tmp_path)))), framework="pt") as f:
        assert f.get_slice("4/hidden_states/0").get_dtype() == "F8_E4M3"
        assert "4/final/pre_norm/scale" in f.keys()


def test_streamed_shards_load_with_the_reference_implementation(tmp_path):
    import hashlib

    from safetensors.torch import load_file

    from hsdump.store.writer import write_safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {
        "a/input_ids": torch.arange(5, dtype=torch.int64),
        "b": torch.randn(3, 7, generator=g).to(torch.bfloat16),
        "c": torch.randn(2, 3, generator=g).to(torch.float16),
        "d": torch.randn(4, generator=g),
        "e": torch.randn(3, 5, generator=g).to(torch.float8_e4m3fn),
    }
    path = tmp_path / "x.safetensors"
    n, digest = write_safetensors(path, tensors, {"format": "f"})
    raw = path.read_bytes()
    assert n == len(raw) and digest == hashlib.sha256(raw).hexdigest()
    back = load_file(str(path))
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(
            back[k].view(torch.uint8), v.view(torch.uint8)
        )
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "f"}


def test_index_is_a_cache_of_the_logs_and_compacts_on_demand(tmp_path, capsys):
    import fcntl

    from hsdump.store import commits

    a = writer(tmp_path, writer_tag="j0of2")
    a.add(0, *sample(0, 5))
    a.close()  # compacts: index.json covers a's log
    b = writer(tmp_path, writer_tag="j1of2")
    b.add(1, *sample(1, 6))
    with open(tmp_path / ".lock", "a") as f:  # another job compacting right now
        fcntl.flock(f, fcntl.LOCK_EX)
        b.close()  # skips its compaction instead of queueing behind it
    index = json.loads((tmp_path / "index.json").read_text())
    assert list(index["covers"]) == ["j0of2"] and len(index["shards"]["path"]) == 1
    ds = HsdumpDataset(str(tmp_path))  # the index plus b's log: both samples
    assert ds.ids == [0, 1] and ds.lengths == [5, 6]
    assert commits.main([str(tmp_path)]) == 0
    assert "2 samples in 2 shards, 2 commit logs" in capsys.readouterr().out
    index = json.loads((tmp_path / "index.json").read_text())
    assert sorted(index["covers"]) == ["j0of2", "j1of2"] and len(index["shards"]["path"]) == 2
    (tmp_path / "index.json").unlink()  # the logs alone are the dataset
    assert HsdumpDataset(str(tmp_path)).ids == [0, 1]


def test_one_log_one_writer(tmp_path):
    from hsdump.store.commits import LogBusy

    a = writer(tmp_path, writer_tag="j0of2")
    with pytest.raises(LogBusy, match="same dist.job_index and dist.num_jobs"):
        writer(tmp_path, writer_tag="j0of2")
    a.close()
    writer(tmp_path, writer_tag="j0of2").close()  # free again once closed


def test_a_version_1_dataset_is_read_and_resumed_as_version_2(tmp_path):
    # a version 1 dataset as the previous writer left it (bcc40b1's layout)
    import hashlib

    from safetensors.torch import save

    d = tmp_path / "v1"
    d.mkdir()
    ids, mask, hs = sample(0, 5)
    tensors = {
        "0/input_ids": torch.tensor(ids),
        "0/loss_mask": torch.tensor(mask),
        **{f"0/hidden_states/{j}": h.to(torch.bfloat16) for j, h in enumerate(hs)},
    }
    data = save(
        tensors,
        metadata={
            "format": "hsdump/speculators-v1",
            "format_version": "1",
            "layers": json.dumps(LAYERS),
        },
    )
    (d / "shard-00000.safetensors").write_bytes(data)
    (d / "index.json").write_text(
        json.dumps(
            {
                "format": "hsdump/speculators-v1",
                "format_version": 1,
                "samples": {"0": "shard-00000.safetensors"},
                "skipped": {"4": "nonfinite in x"},
                "shards": {
                    "shard-00000.safetensors": {
                        "bytes": len(data),
                        "samples": 1,
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
                },
            }
        )
    )
    (d / "manifest.json").write_text(
        json.dumps(
            {
                "format": "hsdump/speculators-v1",
                "format_version": 1,
                "layers": LAYERS,
                "storage_dtype": "bfloat16",
                "resume_key": rows_manifest().resume_key.to_json(),
                "model": {"hidden_size": H, "num_hidden_layers": 8},
            }
        )
    )
    ds = HsdumpDataset(str(d))
    assert (
        ds.version == 1
        and ds.ids == [0]
        and ds.lengths == [5]
        and ds.skipped == {4: "nonfinite in x"}
    )
    w = writer(d)  # resume: upgraded to version 2, then goes on
    assert w.done_ids() == {0, 4}
    w.add(1, *sample(1, 7))
    w.close()
    ds = HsdumpDataset(str(d))
    assert ds.version == 2 and ds.ids == [0, 1] and ds.lengths == [5, 7]
    assert json.loads((d / "manifest.json").read_text())["format_version"] == 2
    assert torch.equal(ds.get(0)["hidden_states"][1], hs[1].to(torch.bfloat16))
    from hsdump.tools.verify import verify

    r = verify(str(d))
    assert r.ok, r.lines()


def test_regenerated_conversations_are_committed_with_their_samples(tmp_path):
    w = writer(tmp_path)
    conv = [{"role": "user", "content": "hi ✓"}, {"role": "assistant", "content": "hello"}]
    w.add(0, *sample(0, 5), conversation=conv)
    w.add(1, *sample(1, 4))
    w.close()
    ds = HsdumpDataset(str(tmp_path))
    assert ds.conversation(0) == conv and ds.conversation(1) is None


def test_overwrite_replaces_a_whole_dataset_and_nothing_else(tmp_path):
    w = writer(tmp_path, writer_tag="j0of2")
    w.add(0, *sample(0, 5))
    w.close()
    (tmp_path / "token_freq.json").write_text("{}")  # what an extraction writes beside it
    (tmp_path / "shard-00003.safetensors").write_bytes(b"x")  # a version 1 leftover
    w = writer(tmp_path, overwrite=True, manifest=rows_manifest(model="other"))
    w.add(1, *sample(1, 4))
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".lock",
        "commits",
        "index.json",
        "manifest.json",
        "shards",
    ]
    assert HsdumpDataset(str(tmp_path)).ids == [1]
    (tmp_path / "notes.txt").write_text("mine")  # a user's file: never deleted, and refused
    with pytest.raises(ValueError, match="holds a dataset made with a different config"):
        writer(tmp_path)
    with pytest.raises(ValueError, match=r"holds no hsdump dataset \(notes.txt\)"):
        writer(tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_shard_holds_at_most_one_shard_size_or_one_sample(tmp_path):
    """The host budget (pipeline.rows_in_flight) counts each held shard as
    max(shard_bytes, one sample): a sample that would overflow the filling shard starts a new
    one, and the writer never holds more than writer_threads + 2 such shards."""
    w = writer(tmp_path, shard_bytes=3000, threads=2)
    lens = [5, 17, 40, 1, 60, 3, 22, 9, 33, 12]
    data = {sid: sample(sid, n) for sid, n in enumerate(lens)}
    size = {}
    for sid, (ids, mask, hs) in data.items():
        size[sid] = len(ids) * 8 * 2 + sum(h.numel() * 2 for h in hs)  # int64 ids+mask, bf16
        assert w.add(sid, ids, mask, hs)
        assert w.host_bytes <= (2 + 2) * max(3000, max(size.values()))
    w.close()
    assert w.host_bytes == 0 and 0 < w.peak_host_bytes <= 4 * max(3000, max(size.values()))
    index = json.loads((tmp_path / "index.json").read_text())
    sa = index["samples"]
    pos = 0
    for count in index["shards"]["count"]:
        ids = sa["id"][pos : pos + count]
        pos += count
        total = sum(size[i] for i in ids)
        assert count == 1 or total <= 3000, (ids, total)  # one sample, or within the size
