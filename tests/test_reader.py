import pickle

import pytest
import torch
from factories import LAYERS, H, make_dataset, rows_manifest, stored_sample

from hsdump.store import fp8
from hsdump.store.reader import (
    HsdumpDataset,
    PadCollator,
    SpeculatorsV1Dataset,
    pad_collate,
    read_safetensors_header,
    resolve_final_state,
    v1_record,
)
from hsdump.store.writer import DatasetWriter

LENS = {0: 5, 3: 17, 4: 9, 7: 40, 8: 1, 11: 12}


@pytest.fixture
def ds_path(tmp_path):
    return make_dataset(tmp_path / "ds", {sid: stored_sample(sid, n) for sid, n in LENS.items()})


def test_random_access_order_len_and_iteration(ds_path):
    ds = HsdumpDataset(str(ds_path))
    assert len(ds) == 6 and ds.ids == sorted(LENS) and ds.layers == LAYERS
    assert [r["id"] for r in ds] == sorted(LENS)
    assert ds[2]["id"] == 4 and 7 in ds and 5 not in ds
    for sid, n in LENS.items():
        ids, mask, hs, _ = stored_sample(sid, n)
        r = ds.get(sid)
        assert torch.equal(r["input_ids"], ids) and torch.equal(r["loss_mask"], mask)
        assert "final" not in r
        for a, b in zip(r["hidden_states"], hs):
            assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))
    with pytest.raises(KeyError):
        ds.get(5)
    small = ds.get(3, hidden=False)  # two preads, no mapping
    assert small.keys() == {"id", "input_ids", "loss_mask"}
    assert torch.equal(small["input_ids"], stored_sample(3, 17)[0])
    assert torch.equal(small["loss_mask"], stored_sample(3, 17)[1])
    assert small["input_ids"].dtype == torch.int64


def test_lengths_come_from_headers_and_filter(ds_path, monkeypatch):
    ds = HsdumpDataset(str(ds_path))
    monkeypatch.setattr("hsdump.store.reader.safe_open", None)  # lengths must not open tensors
    assert ds.lengths == [LENS[s] for s in sorted(LENS)]
    assert ds.num_tokens == sum(LENS.values()) and ds.hidden_size == H
    short = HsdumpDataset(str(ds_path), max_len=12)
    assert short.ids == [0, 4, 8, 11]
    mid = HsdumpDataset(str(ds_path), min_len=5, max_len=17)
    assert mid.ids == [0, 3, 4, 11] and len(mid) == 4 and 7 not in mid and 3 in mid
    assert ds.filter(min_len=10).ids == [3, 7, 11] and ds.ids == sorted(LENS)
    assert ds.filter(ids=[7, 8, 99], max_len=10).ids == [8]
    assert HsdumpDataset(str(ds_path), ids=[11, 0]).ids == [0, 11]


def test_tensors_are_memory_mapped_not_copied(tmp_path):
    n, big = 256, 4096
    path = make_dataset(
        tmp_path / "big",
        {
            0: (
                torch.zeros(n, dtype=torch.int64),
                torch.ones(n, dtype=torch.int64),
                [torch.randn(n, big) for _ in LAYERS],
                {},
            )
        },
    )
    ds = HsdumpDataset(str(path))
    h = ds.get(0)["hidden_states"][1]
    shard = path / "shard-00000.safetensors"
    maps = [ln for ln in open("/proc/self/maps") if ln.rstrip().endswith(str(shard))]
    assert maps, "hidden states are not backed by a mapping of the shard file"
    ranges = [[int(x, 16) for x in ln.split()[0].split("-")] for ln in maps]
    assert any(lo <= h.data_ptr() < hi for lo, hi in ranges)
    assert h.untyped_storage().nbytes() == n * big * 2  # no larger hidden buffer either


def test_dataloader_workers_and_pad_collate(ds_path):
    ds = HsdumpDataset(str(ds_path))
    pickle.dumps(ds)  # picklable for worker processes
    ds.get(0)
    assert pickle.loads(pickle.dumps(ds))._handles == {}
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=PadCollator(), num_workers=2)
    batches = list(loader)
    assert [b["ids"].tolist() for b in batches] == [[0, 3, 4, 7], [8, 11]]
    b = batches[0]
    assert b["input_ids"].shape == (4, 40) and b["lengths"].tolist() == [5, 17, 9, 40]
    assert len(b["hidden_states"]) == 3 and b["hidden_states"][0].shape == (4, 40, H)
    assert b["attention_mask"].sum(1).tolist() == [5, 17, 9, 40]
    r = ds.get(3)
    assert torch.equal(b["input_ids"][1, :17], r["input_ids"])
    assert torch.equal(b["loss_mask"][1, :17], r["loss_mask"])
    assert b["loss_mask"][1, 17:].eq(0).all() and b["input_ids"][1, 17:].eq(0).all()
    assert torch.equal(b["hidden_states"][2][1, :17], r["hidden_states"][2])
    assert b["hidden_states"][2][1, 17:].eq(0).all()

    c = PadCollator(pad_token_id=-1, pad_to_multiple_of=8, max_len=10)([ds.get(3), ds.get(8)])
    assert c["input_ids"].shape == (2, 16) and c["lengths"].tolist() == [10, 1]
    assert c["input_ids"][1, 1:].eq(-1).all() and c["attention_mask"].sum().item() == 11
    assert pad_collate([ds.get(8)])["input_ids"].shape == (1, 1)


def test_fp8_dataset_is_dequantized_transparently(tmp_path):
    samples = {sid: stored_sample(sid, n) for sid, n in LENS.items()}
    path = make_dataset(tmp_path / "fp8", samples, storage="fp8")
    head = read_safetensors_header(path / "shard-00000.safetensors")
    assert head["0/hidden_states/1"]["dtype"] == "F8_E4M3"
    assert head["0/hidden_states/1/scale"] == {
        **head["0/hidden_states/1/scale"],
        "dtype": "F32",
        "shape": [5],
    }
    assert head["__metadata__"]["storage_dtype"] == "float8_e4m3fn"
    ds = HsdumpDataset(str(path))
    assert ds.lengths == [LENS[s] for s in sorted(LENS)]  # scales are not mistaken for samples
    for sid, (ids, mask, hs, _) in samples.items():
        r = ds.get(sid)
        assert torch.equal(r["input_ids"], ids)
        for a, b in zip(r["hidden_states"], hs):
            assert a.dtype == torch.bfloat16 and a.shape == b.shape
            assert fp8.rel_error(a, b) < 0.05
    assert (
        HsdumpDataset(str(path), dtype=torch.float32)[0]["hidden_states"][0].dtype == torch.float32
    )


def test_final_states_and_the_v1_view(tmp_path):
    samples = {
        sid: stored_sample(sid, n, final=("pre_norm", "post_norm")) for sid, n in LENS.items()
    }
    ds = HsdumpDataset(str(make_dataset(tmp_path / "f", samples)))
    assert ds.final_kinds == ["pre_norm", "post_norm"]
    r = ds.get(7)
    assert torch.equal(r["final"]["post_norm"], samples[7][3]["post_norm"].bfloat16())
    v1 = SpeculatorsV1Dataset(ds)[3]
    assert set(v1) == {"input_ids", "hidden_states", "loss_mask"}
    assert len(v1["hidden_states"]) == 4
    assert torch.equal(v1["hidden_states"][-1], samples[7][3]["pre_norm"].bfloat16())
    # speculators' own standardize_data_v1 (0.3-0.4): cat(hs[:-1]) and hs[-1]
    drafter_in = torch.cat(v1["hidden_states"][:-1], dim=-1)
    assert drafter_in.shape == (40, 3 * H)
    b = PadCollator()([ds.get(0), ds.get(7)])
    assert b["final"]["pre_norm"].shape == (2, 40, H)
    assert resolve_final_state(ds, "auto", prefer="post_norm") == "post_norm"
    assert v1_record(r, None)["hidden_states"] == r["hidden_states"]


def test_v1_view_without_a_final_state_refuses_or_warns(ds_path):
    ds = HsdumpDataset(str(ds_path))
    assert ds.final_kinds == []
    with pytest.raises(ValueError, match="holds no final-layer state 'pre_norm'"):
        SpeculatorsV1Dataset(ds)
    with pytest.warns(UserWarning, match="not the final layer"):
        v = SpeculatorsV1Dataset(ds, final_state="last-layer")
    rec = v[1]
    assert len(rec["hidden_states"]) == 4
    assert torch.equal(rec["hidden_states"][3], rec["hidden_states"][2])


def test_reads_what_the_writer_writes(tmp_path):
    w = DatasetWriter(str(tmp_path), rows_manifest(), shard_bytes=1500)
    for sid, n in LENS.items():
        ids, mask, hs, _ = stored_sample(sid, n)
        w.add(sid, ids.tolist(), mask.tolist(), hs)
    w.close()
    ds = HsdumpDataset(str(tmp_path), min_len=9)
    assert ds.ids == [3, 4, 7, 11] and ds.lengths == [17, 9, 40, 12]
    assert torch.equal(ds.get(4)["hidden_states"][0], stored_sample(4, 9)[2][0].bfloat16())


def test_fp8_raw_for_gpu_dequantize(tmp_path):
    samples = {sid: stored_sample(sid, n, final=("post_norm",)) for sid, n in LENS.items()}
    path = make_dataset(tmp_path / "fp8", samples, storage="fp8")
    raw = HsdumpDataset(str(path), dequantize=False)
    r = raw.get(7)
    assert r["hidden_states"][0].dtype == torch.float8_e4m3fn
    assert [s.shape for s in r["hidden_states_scale"]] == [(40,)] * 3
    assert r["final_scale"]["post_norm"].shape == (40,)
    deq = HsdumpDataset(str(path)).get(7)
    assert torch.equal(
        fp8.dequantize(r["hidden_states"][1], r["hidden_states_scale"][1]), deq["hidden_states"][1]
    )
    b = PadCollator()([raw.get(3), r])
    assert b["hidden_states"][0].dtype == torch.float8_e4m3fn
    assert b["hidden_states"][0].shape == (2, 40, H)
    assert b["hidden_states_scale"][2].shape == (2, 40)
    assert b["final_scale"]["post_norm"].shape == (2, 40)
    assert torch.equal(b["hidden_states"][1][1].float(), r["hidden_states"][1].float())


def test_pread_mode_gives_the_same_records_unmapped(tmp_path):
    samples = {sid: stored_sample(sid, n, final=("pre_norm",)) for sid, n in LENS.items()}
    for storage in ("bfloat16", "fp8"):
        path = make_dataset(tmp_path / storage, samples, storage=storage)
        a, b = HsdumpDataset(str(path)), HsdumpDataset(str(path), mmap=False)
        for sid in LENS:
            ra, rb = a.get(sid), b.get(sid)
            assert torch.equal(ra["input_ids"], rb["input_ids"])
            assert all(torch.equal(x, y) for x, y in zip(ra["hidden_states"], rb["hidden_states"]))
            assert torch.equal(ra["final"]["pre_norm"], rb["final"]["pre_norm"])
        assert b._handles == {}  # never mapped
        b.close()


def test_reads_the_writers_fp8_and_final_states(tmp_path):
    w = DatasetWriter(
        str(tmp_path),
        rows_manifest(storage_dtype="fp8", final=["pre_norm", "post_norm"]),
        shard_bytes=1500,
    )
    data = {sid: stored_sample(sid, n, final=("pre_norm", "post_norm")) for sid, n in LENS.items()}
    for sid, (ids, mask, hs, fin) in data.items():
        assert w.add(sid, ids.tolist(), mask.tolist(), hs, fin)
    w.close()
    ds = HsdumpDataset(str(tmp_path), min_len=9)
    assert ds.ids == [3, 4, 7, 11] and ds.final_kinds == ["pre_norm", "post_norm"]
    assert fp8.is_fp8(ds.storage_dtype)
    for sid in ds.ids:
        r, (_, _, hs, fin) = ds.get(sid), data[sid]
        assert all(fp8.rel_error(a, b) < 0.05 for a, b in zip(r["hidden_states"], hs))
        assert fp8.rel_error(r["final"]["post_norm"], fin["post_norm"]) < 0.05
    v1 = SpeculatorsV1Dataset(ds)[0]
    assert len(v1["hidden_states"]) == 4 and v1["hidden_states"][0].dtype == torch.bfloat16
