"""`python -m hsdump verify`: a clean dataset passes; each kind of damage is named."""

import dataclasses
import hashlib
import json
import shutil

import pytest
import torch
from factories import LAYERS, H, patch_manifest, rows_manifest, sample

from hsdump.store.writer import DatasetWriter
from hsdump.tools.verify import UNLISTED, main, read_header, verify

MANIFEST = {
    "format": "hsdump/speculators-v1",
    "format_version": 1,
    "layers": LAYERS,
    "convention": "hf_hidden_states_index",
    "storage_dtype": "bfloat16",
    "model": {"path": "m", "hidden_size": H, "num_hidden_layers": 8},
}


def make(path, sizes=((0, 5), (3, 17), (7, 40), (8, 1), (9, 6)), data=None, **manifest_keys):
    """A dataset of `sizes` written by the writer; `manifest_keys` then set in its manifest."""
    w = DatasetWriter(str(path), rows_manifest(), shard_bytes=1000)
    for sid, n in sizes:
        assert w.add(sid, *(data[sid] if data else sample(sid, n)))
    w.close()
    if manifest_keys:
        patch_manifest(path, **manifest_keys)
    return view(path)


def view(path):
    """The commit records as {"samples": {"sid": shard}, "shards": {shard: record}}."""
    from hsdump.store import commits

    c = commits.load(path)
    return {
        "samples": {str(k): v for k, v in c.samples.items()},
        "shards": {k: {**v, "samples": len(v["ids"])} for k, v in c.shards.items()},
    }


def edit_index(path, fn):
    """Apply `fn` to index.json (version 2: it covers the whole log after close)."""
    index = json.loads((path / "index.json").read_text())
    fn(index)
    (path / "index.json").write_text(json.dumps(index))


def tensor_at(path, key):
    """Byte offset and length of a tensor's data inside a safetensors file."""
    header, start = read_header(path)
    a, b = header[key]["data_offsets"]
    return start + a, b - a


def patch(path, offset, data: bytes):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def lines(report):
    return [p.line() for p in report.problems]


@pytest.fixture
def ds(tmp_path):
    out = tmp_path / "ds"
    index = make(out)
    assert len(index["shards"]) >= 3
    return out, index


def test_clean_dataset_passes(ds, capsys):
    out, index = ds
    r = verify(out)
    assert r.ok and r.problems == [] and r.info == []
    assert r.samples_checked == r.samples_ok == r.samples_listed == 5
    assert r.shards == len(index["shards"])
    assert r.bytes == r.bytes_hashed == sum(s["bytes"] for s in index["shards"].values())
    assert main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "OK: 5 of 5 samples checked (5 clean)" in text and "0 problems" in text
    assert main([str(out), "--json", "--quick"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["ok"] and js["samples_ok"] == 5 and js["bytes_hashed"] == 0 and js["problems"] == []


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main([]) == 2
    assert main([str(tmp_path / "nope")]) == 2
    assert main([str(tmp_path), "--bogus"]) == 2
    assert main(["--help"]) == 0
    capsys.readouterr()


def test_empty_or_foreign_folder_fails(tmp_path):
    r = verify(tmp_path)
    assert not r.ok and "manifest.json: missing" in lines(r)
    assert main([str(tmp_path)]) == 1


def test_flipped_byte_is_a_sha256_mismatch(ds):
    out, index = ds
    name = index["samples"]["3"]
    off, _ = tensor_at(out / name, "3/hidden_states/1")
    data = bytearray((out / name).read_bytes())
    data[off] ^= 0x01  # lowest mantissa bit of a bf16: still finite, still plausible
    (out / name).write_bytes(bytes(data))
    r = verify(out)
    assert len(r.problems) == 1
    assert r.problems[0].where == name and "sha256 mismatch" in r.problems[0].what
    assert verify(out, quick=True).ok  # only the checksum can see this one
    assert main([str(out)]) == 1


def test_truncated_shard_is_named(ds):
    out, index = ds
    name = index["samples"]["7"]
    p = out / name
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    r = verify(out)
    mine = [x.what for x in r.problems if x.where == name]
    assert any(
        "truncated" in w and f"the index records {index['shards'][name]['bytes']}" in w
        for w in mine
    )
    assert any("sha256 mismatch" in w for w in mine)
    assert any("header is unusable" in w or "cannot open" in w for w in mine)
    assert not verify(out, quick=True).ok
    assert r.samples_ok == 5 - index["shards"][name]["samples"]


def test_deleted_shard_is_named(ds):
    out, index = ds
    name = index["samples"]["0"]
    (out / name).unlink()
    r = verify(out)
    assert f"{name}: missing: listed in the index but not on disk" in lines(r)
    assert any(
        p.where == name and "samples (0" in p.what and "cannot be read" in p.what
        for p in r.problems
    )
    assert main([str(out), "--quick"]) == 1


def test_nan_in_tensor_bytes_is_named(ds):
    out, index = ds
    name = index["samples"]["3"]
    off, n = tensor_at(out / name, "3/hidden_states/2")
    patch(out / name, off + 2 * (H * 4 + 5), b"\xc0\x7f")  # bf16 NaN at row 4, column 5
    r = verify(out, quick=True)
    assert lines(r) == [f"{name}: 3/hidden_states/2: 1 non-finite values (NaN/Inf), first in row 4"]
    assert r.samples_checked == 5 and r.samples_ok == 4
    r = verify(out)
    assert {p.where for p in r.problems} == {name, f"{name}: 3/hidden_states/2"}
    assert any("sha256 mismatch" in p.what for p in r.problems)


def test_loss_mask_and_wrong_shape_are_named(tmp_path):
    out = tmp_path / "ds"
    ids, mask, hs = sample(1, 4)
    make(out, sizes=[(1, 4)], data={1: (ids, [0, 2, 1, 1], hs)})
    assert lines(verify(out, quick=True)) == [
        "shards/main/0000/main-000000.safetensors: 1/loss_mask: values outside {0, 1} (first at "
        "position 1: 2)"
    ]
    out2 = tmp_path / "ds2"
    make(out2, sizes=[(1, 4)], model={"hidden_size": 16})
    r = verify(out2, quick=True)
    assert len(r.problems) == 3 and all("hidden_size is 16" in p.what for p in r.problems)


def test_index_entry_for_a_sample_absent_from_its_shard(ds):
    out, index = ds
    name = index["samples"]["0"]

    def add99(idx):  # one more sample id in `name`'s record
        sh, sa = idx["shards"], idx["samples"]
        k = sh["path"].index(name)
        end = sum(sh["count"][: k + 1])
        sh["count"][k] += 1
        for col, v in (("id", 99), ("length", 4), ("masked", 2)):
            sa[col].insert(end, v)

    edit_index(out, add99)
    r = verify(out)
    assert lines(r) == [
        f"{name}: sample 99: absent from its shard: the index lists it but the "
        "shard holds none of its tensors"
    ]
    assert r.samples_listed == 6 and r.samples_checked == r.samples_ok == 5


def test_v1_index_sample_in_an_unlisted_shard(tmp_path):
    out = tmp_path / "v1"
    hand_built(
        out,
        {
            "shard-00000.safetensors": {
                "0/input_ids": torch.zeros(2, dtype=torch.int64),
                "0/loss_mask": torch.ones(2, dtype=torch.int64),
                **{
                    f"0/hidden_states/{j}": torch.zeros(2, H, dtype=torch.bfloat16)
                    for j in range(3)
                },
            }
        },
        MANIFEST,
    )
    assert verify(out).ok
    idx = json.loads((out / "index.json").read_text())
    idx["samples"]["0"] = "shard-00042.safetensors"
    (out / "index.json").write_text(json.dumps(idx))
    problems = lines(verify(out, quick=True))
    assert any(
        p.startswith("sample 0: index.json places it in 'shard-00042.safetensors'")
        for p in problems
    )


def test_record_outside_the_dataset_folder_is_refused(ds):
    out, index = ds
    with open(out / "commits" / "main.jsonl", "a") as f:
        f.write(
            json.dumps(
                {"shard": "../elsewhere.safetensors", "bytes": 1, "sha256": "0", "ids": [50]}
            )
            + "\n"
        )
    r = verify(out, quick=True)
    assert [p.what for p in r.problems] == [
        "shard path '../elsewhere.safetensors' is not a .safetensors path inside the dataset folder"
    ]
    assert r.problems[0].where.startswith("commits/main.jsonl byte ")


def test_duplicate_sample_in_two_shards(ds, tmp_path):
    out, index = ds
    other = tmp_path / "other"
    make(other, sizes=[(0, 5), (10, 3)])  # sample 0 again, plus a new sample 10
    (src,) = view(other)["shards"]
    dup = "shards/extra/0000/extra-000000.safetensors"
    (out / dup).parent.mkdir(parents=True)
    shutil.copy(other / src, out / dup)
    data = (out / dup).read_bytes()
    with open(out / "commits" / "extra.jsonl", "w") as f:  # a second writer's log
        f.write(
            json.dumps(
                {
                    "shard": dup,
                    "bytes": len(data),
                    "ids": [10],
                    "lengths": [3],
                    "masked": [2],
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
            + "\n"
        )
    r = verify(out)
    assert lines(r) == [
        f"{dup}: holds tensors of sample 0, which the index places in "
        f"{index['samples']['0']} (duplicate sample in two shards)"
    ]
    assert r.samples_ok == 6
    # the same sample committed by two records
    with open(out / "commits" / "extra.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "shard": dup + "x.safetensors",
                    "bytes": 1,
                    "sha256": "0",
                    "ids": [10],
                    "lengths": [3],
                    "masked": [2],
                }
            )
            + "\n"
        )
    assert any(
        p.startswith(f"sample 10: committed in {dup} and again in ") and "(duplicate sample)" in p
        for p in lines(verify(out, quick=True))
    )


def test_torn_record_is_info_and_a_corrupt_one_a_problem(ds):
    out, index = ds
    log = out / "commits" / "main.jsonl"
    with open(log, "ab") as f:
        f.write(b'{"shard":"shards/main/0000/main-0000')  # a crash in the middle of a commit
    r = verify(out)
    assert r.ok and (
        "commits/main.jsonl",
        "a torn last record of 36 bytes (a crash during a "
        "commit; ignored, and cut when that writer resumes)",
    ) in {(p.where, p.what) for p in r.info}
    (out / "index.json").unlink()  # the log alone holds the dataset
    text = log.read_bytes()
    lines_ = text.split(b"\n")
    lines_[1] = b"#" + lines_[1][1:]  # a damaged record in the middle
    log.write_bytes(b"\n".join(lines_))
    r = verify(out, quick=True)
    assert any(
        p.where == "commits/main.jsonl" and "a record that does not parse at byte" in p.what
        for p in r.problems
    )


def test_record_lengths_and_masks_must_match_the_shard(ds):
    out, index = ds
    name = index["samples"]["7"]

    def lie(idx):
        sa = idx["samples"]
        k = sa["id"].index(7)
        sa["length"][k] += 1
        sa["masked"][k] -= 1

    edit_index(out, lie)
    got = lines(verify(out, quick=True))
    assert f"{name}: sample 7: commit record says 41 tokens, the shard holds [40]" in got
    assert f"{name}: 7/loss_mask: 20 loss-masked tokens, the commit record says 19" in got


def test_unlisted_garbage_is_info_not_failure(ds, capsys):
    out, _ = ds
    (out / "shard-00077.safetensors").write_bytes(b"\x00" * 100)
    (out / "shards/main/0000/main-000077.safetensors").write_bytes(b"\x00" * 100)
    (out / "shards/main/0000/main-000078.safetensors.tmp.h.1.2").write_bytes(b"junk")
    (out / "index.json.tmp.55").write_text("{")
    r = verify(out)
    assert r.ok
    assert {(p.where, p.what) for p in r.info} == {
        ("shard-00077.safetensors", UNLISTED),
        ("index.json.tmp.55", UNLISTED),
        ("shards/main/0000/main-000077.safetensors", UNLISTED),
        ("shards/main/0000/main-000078.safetensors.tmp.h.1.2", UNLISTED),
    }
    assert main([str(out)]) == 0
    assert f"info    shard-00077.safetensors: {UNLISTED}" in capsys.readouterr().out


def test_manifest_and_shard_metadata_must_agree(ds):
    out, _ = ds
    m = json.loads((out / "manifest.json").read_text())
    m["layers"] = [1, 2, 3]
    (out / "manifest.json").write_text(json.dumps(m))
    r = verify(out, quick=True)
    assert r.problems and all("__metadata__ layers is '[2, 4, 5]'" in p.what for p in r.problems)


def hand_built(path, shards, manifest):
    """A dataset written without DatasetWriter: {shard name: {tensor name: tensor}}."""
    from safetensors.torch import save

    path.mkdir()
    index = {
        "format": manifest["format"],
        "format_version": 1,
        "samples": {},
        "shards": {},
        "skipped": {},
    }
    meta = {
        "format": manifest["format"],
        "format_version": "1",
        "layers": json.dumps(manifest["layers"]),
    }
    for name, tensors in shards.items():
        data = save(tensors, metadata=meta)
        (path / name).write_bytes(data)
        sids = sorted({int(k.split("/")[0]) for k in tensors})
        index["shards"][name] = {
            "bytes": len(data),
            "samples": len(sids),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        index["samples"].update({str(sid): name for sid in sids})
    (path / "index.json").write_text(json.dumps(index))
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_fp8_storage_and_final_states(tmp_path):
    from hsdump.store import fp8

    tensors = {}
    for sid, n in [(0, 4), (1, 6)]:
        ids, mask, hs = sample(sid, n)
        tensors[f"{sid}/input_ids"] = torch.tensor(ids)
        tensors[f"{sid}/loss_mask"] = torch.tensor(mask)
        for j, h in enumerate(hs + [hs[-1]]):
            name = f"{sid}/hidden_states/{j}" if j < len(LAYERS) else f"{sid}/final/pre_norm"
            tensors.update(fp8.encode(name, h))
    manifest = {**MANIFEST, "storage_dtype": "fp8"}
    hand_built(tmp_path / "ok", {"shard-00000.safetensors": tensors}, manifest)
    r = verify(tmp_path / "ok")
    assert r.ok, lines(r)
    assert r.samples_ok == 2

    bad = dict(tensors)
    bad["1/hidden_states/0/scale"] = bad["1/hidden_states/0/scale"].clone()
    bad["1/hidden_states/0/scale"][2] = float("nan")
    del bad["0/hidden_states/2/scale"]
    del bad["1/final/pre_norm"], bad["1/final/pre_norm/scale"]
    hand_built(tmp_path / "bad", {"shard-00000.safetensors": bad}, manifest)
    name = "shard-00000.safetensors"
    assert lines(verify(tmp_path / "bad")) == [
        f"{name}: 0/hidden_states/2/scale: missing",
        f"{name}: sample 1: has final-layer states [], but sample 0 has ['pre_norm']",
        f"{name}: 1/hidden_states/0/scale: 1 non-finite or non-positive scales, first in row 2",
    ]
    # unscaled storage: the scales are unexpected and the dtype is wrong
    (tmp_path / "ok" / "manifest.json").write_text(json.dumps(MANIFEST))
    r = verify(tmp_path / "ok", quick=True)
    assert any("a scale, but manifest.json stores hidden states unscaled" in x for x in lines(r))
    assert any("dtype F8_E4M3, expected BF16" in x for x in lines(r))


def test_retokenize(tmp_path, tiny_llama, monkeypatch):
    from hsdump.config import Config, DatasetConfig, ModelConfig, OutputConfig
    from hsdump.corpus import tokenizer
    from hsdump.corpus.chat import template_sha256
    from hsdump.corpus.sources import load_rows
    from hsdump.corpus.tokenization import tokenize_dataset

    # the tokenizer is loaded once (slow), then handed to verify's own load_tokenizer calls
    real, loaded = tokenizer.load_tokenizer, {}

    def load_tokenizer(model, path):
        key = (repr(model), path)
        if key not in loaded:
            loaded[key] = real(model, path)
        return loaded[key]

    monkeypatch.setattr(tokenizer, "load_tokenizer", load_tokenizer)

    src = tmp_path / "chat.jsonl"
    convs = [
        [
            {"from": "human", "value": f"Question {i}?"},
            {"from": "gpt", "value": f"Answer number {i}."},
        ]
        for i in range(3)
    ]
    src.write_text("".join(json.dumps({"conversations": c}) + "\n" for c in convs))
    out = tmp_path / "ds"
    cfg = Config(
        model=ModelConfig(path="tiny:llama"),
        dataset=DatasetConfig(path=str(src)),
        output=OutputConfig(dir=str(out)),
    )
    tok = load_tokenizer(cfg.model, tiny_llama)
    t = tokenize_dataset(load_rows(cfg.dataset), tok, cfg.dataset)
    assert t.ids == [0, 1, 2]
    g = torch.Generator().manual_seed(0)
    data = {
        sid: (ids, mask, [torch.randn(len(ids), H, generator=g) for _ in LAYERS])
        for sid, ids, mask in zip(t.ids, t.input_ids, t.loss_mask)
    }
    make(
        out,
        sizes=[(sid, 0) for sid in t.ids],
        data=data,
        config=dataclasses.asdict(cfg),
        tokenizer={"path": tiny_llama, "chat_template_sha256": template_sha256(tok)},
    )

    r = verify(out, retokenize=True)
    assert r.ok, lines(r)
    assert r.samples_retokenized == 3

    index = view(out)
    name = index["samples"]["1"]
    off, _ = tensor_at(out / name, "1/input_ids")
    stored = t.input_ids[1][3]
    patch(out / name, off + 8 * 3, (stored + 1).to_bytes(8, "little"))
    r = verify(out, retokenize=True, quick=True)
    assert lines(r) == [
        "sample 1: --retokenize: input_ids differ from a fresh tokenization of "
        f"row 1 at position 3 (stored {stored + 1}, fresh {stored})"
    ]
    assert r.samples_retokenized == 2
    assert verify(out, quick=True).ok  # only re-tokenizing can see this one
    assert len(loaded) == 1  # verify asked for the very tokenizer the data was made with


def test_regenerated_conversations_are_checked(tmp_path):
    out = tmp_path / "ds"
    w = DatasetWriter(str(out), rows_manifest())
    w.add(0, *sample(0, 5), conversation=[{"role": "user", "content": "x"}])
    w.close()
    assert verify(out).ok
    (name,) = view(out)["shards"]
    data = (out / name).read_bytes()
    bad = data.replace(b'"{\\"0\\"', b'"{\\"7\\"')  # the record now names sample 7
    assert bad != data
    (out / name).write_bytes(bad)
    assert lines(verify(out, quick=True)) == [
        f"{name}: __metadata__ conversations name samples ['7'] that the shard does not hold"
    ]
