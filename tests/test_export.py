"""Exports, read back the way each peer's own loader reads them.

The reading code below mirrors, line for line where it matters, the loaders of
speculators 0.9.0 (`speculators.train.data.ArrowDataset._get_raw_data` with
`hs_connectors.FileTransfer`), speculators 0.3.0 (`Eagle3SampleFileDataset` with
`list_files` and `standardize_data_v1`) and SpecForge 0.2.0
(`OfflineEagle3Dataset.process_data` with `list_local_files`). When the real speculators
package can be imported (it cannot in hsdump's venv: it pins datasets<=5.1.0, hsdump pins
5.2.0), `test_speculators_own_arrow_dataset_reads_the_export` runs its own class too.
"""

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from factories import LAYERS, ROOT, H, make_dataset, rows_manifest, stored_sample
from safetensors.torch import load_file

from hsdump.errors import Refusal
from hsdump.store.reader import HsdumpDataset
from hsdump.tools import export as ex

LENS = {0: 5, 2: 17, 3: 9, 9: 40, 10: 1, 12: 12, 13: 7}


@pytest.fixture
def src(tmp_path):
    return make_dataset(
        tmp_path / "src",
        {sid: stored_sample(sid, n, final=("pre_norm", "post_norm")) for sid, n in LENS.items()},
    )


@pytest.fixture
def plain(tmp_path):  # no final-layer capture
    return make_dataset(tmp_path / "plain", {sid: stored_sample(sid, n) for sid, n in LENS.items()})


def bf(t):
    return t.to(torch.bfloat16)


def speculators_read(dest: Path, index: int) -> dict:
    """speculators 0.9.0 ArrowDataset._get_raw_data for a cached sample."""
    data = load_from_disk(str(dest))
    loaded_hs = load_file(dest / "hidden_states" / f"hs_{index}.safetensors")
    assert torch.equal(loaded_hs["token_ids"], data[index]["input_ids"])
    return {
        "hidden_states": loaded_hs["hidden_states"][:, :-1].flatten(1),
        "input_ids": loaded_hs["token_ids"],
        "verifier_last_hidden_states": loaded_hs["hidden_states"][:, -1],
        "loss_mask": data[index]["loss_mask"],
    }


def test_speculators_layout_as_its_code_reads_it(src, tmp_path):
    dest = tmp_path / "spec"
    c = ex.export(str(src), str(dest), "speculators", progress=False)
    assert c == {"written": 7, "skipped": 0, "bytes": c["bytes"]} and c["bytes"] > 0
    data = load_from_disk(str(dest))
    assert data.column_names == ["input_ids", "loss_mask", "seq_len"]
    ids = sorted(LENS)
    # ArrowDataset._compute_approx_lengths
    assert list(data.with_format(None)["seq_len"]) == [LENS[s] for s in ids]
    for i, sid in enumerate(ids):
        _, mask, hs, fin = stored_sample(sid, LENS[sid], final=("pre_norm", "post_norm"))
        r = speculators_read(dest, i)
        assert r["hidden_states"].shape == (LENS[sid], 3 * H)
        assert r["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(r["hidden_states"], bf(torch.cat(hs, dim=-1)))
        assert torch.equal(r["verifier_last_hidden_states"], bf(fin["pre_norm"]))
        assert torch.equal(r["loss_mask"], mask) and r["input_ids"].dtype == torch.int64
    freq = torch.load(dest / "token_freq.pt", weights_only=True)
    want = Counter()
    for sid in ids:
        t, m, _, _ = stored_sample(sid, LENS[sid])
        want.update(t[m.bool()].tolist())
    assert freq == dict(want) and all(type(k) is int for k in freq)
    state = json.loads((dest / "hsdump_export.json").read_text())
    assert state["ids"] == ids and state["complete"] and state["final_state"] == "pre_norm"
    assert not list(dest.rglob(".*tmp*"))


def test_speculators_own_arrow_dataset_reads_the_export(src, tmp_path):
    # speculators 0.6.0's own ArrowDataset and CollateFn (the hs_{i}.safetensors layout of
    # 0.5-0.6; 0.7+ read the same files through hs_connectors)
    pkgs = {"speculators": {}, "speculators.train": {}}
    nt = _load_peer_file(
        "HSDUMP_SPECULATORS06_SRC",
        "speculators/train/noise_transforms.py",
        "speculators.train.noise_transforms",
        pkgs,
    )
    client = {k: None for k in ("ClientItem", "generate_hidden_states", "wait_for_lock")}
    client.update(DEFAULT_MAX_RETRIES=3, DEFAULT_REQUEST_TIMEOUT=60.0)
    data_mod = _load_peer_file(  # the vLLM client and openai are only used with on_missing=generate
        "HSDUMP_SPECULATORS06_SRC",
        "speculators/train/data.py",
        "speculators.train.data",
        {
            **pkgs,
            "openai": {"OpenAI": None},
            "speculators.data_generation": {},
            "speculators.data_generation.vllm_client": client,
            "speculators.train.noise_transforms": vars(nt),
        },
    )
    dest = tmp_path / "spec"
    ex.export(str(src), str(dest), "speculators", progress=False)
    ds = data_mod.ArrowDataset(max_len=64, datapath=str(dest), on_missing="raise")
    assert len(ds) == 7 and ds.approx_lengths == [LENS[s] for s in sorted(LENS)]
    for i, sid in enumerate(sorted(LENS)):
        _, mask, hs, fin = stored_sample(sid, LENS[sid], final=("pre_norm", "post_norm"))
        r = ds[i]
        assert torch.equal(r["hidden_states"], bf(torch.cat(hs, dim=-1)))
        assert torch.equal(r["verifier_last_hidden_states"], bf(fin["pre_norm"]))
        assert torch.equal(r["loss_mask"], mask) and r["lengths"].tolist() == [LENS[sid]]
    batch = data_mod.create_collate_fn(max_len=64, hidden_size=H)([ds[0], ds[1]])
    assert batch["hidden_states"].shape == (1, 64, 3 * H)


def test_speculators_v1_layout(src, tmp_path):
    dest = tmp_path / "v1"
    ex.export(str(src), str(dest), "speculators-v1", progress=False)
    # speculators 0.3 list_files: every file under DEST whose name ends with "pt"
    files = sorted(
        (Path(r) / f for r, _, fs in os.walk(dest) for f in fs if f.endswith("pt")),
        key=lambda p: int(p.stem.split("_")[1]),
    )
    assert [p.name for p in files] == [f"data_{i}.pt" for i in range(7)]
    for i, sid in enumerate(sorted(LENS)):
        ids, mask, hs, fin = stored_sample(sid, LENS[sid], final=("pre_norm", "post_norm"))
        data = torch.load(files[i], mmap=True, weights_only=True, map_location="cpu")
        assert set(data) == {"input_ids", "hidden_states", "loss_mask"}
        # standardize_data_v1
        drafter = torch.cat(data["hidden_states"][:-1], dim=-1)
        verifier = data["hidden_states"][-1]
        assert torch.equal(drafter, bf(torch.cat(hs, dim=-1)))
        assert torch.equal(verifier, bf(fin["pre_norm"]))
        assert torch.equal(data["input_ids"], ids) and torch.equal(data["loss_mask"], mask)
    lengths = json.loads((dest / "sample_lengths.json").read_text())
    assert lengths == {str(i): LENS[s] for i, s in enumerate(sorted(LENS))}
    cfg = json.loads((dest / "data_config.json").read_text())
    assert cfg["layers"] == LAYERS and cfg["verifier_state"] == "pre_norm"


def specforge_list(dest):
    out = []
    for root, _, files in os.walk(dest):
        out += [os.path.join(root, f) for f in files if f.endswith((".ckpt", ".ckpt.gz"))]
    return sorted(out)


def test_specforge_layout(src, tmp_path):
    dest = tmp_path / "sf"
    ex.export(str(src), str(dest), "specforge", progress=False)
    files = specforge_list(dest)
    assert sorted(Path(f).relative_to(dest).as_posix() for f in files) == sorted(
        f"rows_0-2000/data_{i}.ckpt" for i in range(7)
    )
    for i, sid in enumerate(sorted(LENS)):
        ids, mask, hs, fin = stored_sample(sid, LENS[sid], final=("pre_norm", "post_norm"))
        data = torch.load(dest / f"rows_0-2000/data_{i}.ckpt", weights_only=True, mmap=True)
        n = LENS[sid]
        assert data["aux_hidden_state"].shape == (1, n, 3 * H)
        assert data["hidden_state"].shape == (1, n, H)
        assert torch.equal(data["hidden_state"][0], bf(fin["post_norm"]))
        # OfflineEagle3Dataset.process_data
        max_len = 16
        hidden_state = data["aux_hidden_state"].squeeze(0)[:max_len][None, :]
        target = data["hidden_state"].squeeze(0)[:max_len][None, :]
        input_ids = data["input_ids"][:max_len][None, :]
        loss_mask = data["loss_mask"][:max_len][None, :]
        m = min(n, max_len)
        assert hidden_state.shape == (1, m, 3 * H) and target.shape == (1, m, H)
        assert input_ids.shape == (1, m) and loss_mask.shape == (1, m)
        assert torch.equal(hidden_state[0], bf(torch.cat(hs, -1))[:m])
        assert torch.equal(input_ids[0], ids[:m]) and torch.equal(loss_mask[0], mask[:m])
    assert ex.rel_path("specforge", 1999) == "rows_0-2000/data_1999.ckpt"
    assert ex.rel_path("specforge", 2000) == "rows_2000-4000/data_2000.ckpt"
    assert ex.rel_path("specforge", 4321) == "rows_4000-6000/data_4321.ckpt"


def test_no_final_state_is_refused_unless_last_layer_is_asked(plain, tmp_path):
    for fmt, kind in (
        ("speculators", "pre_norm"),
        ("speculators-v1", "pre_norm"),
        ("specforge", "post_norm"),
    ):
        with pytest.raises(ValueError, match=f"no final-layer state '{kind}'"):
            ex.export(str(plain), str(tmp_path / fmt), fmt, progress=False)
    with pytest.warns(UserWarning, match="not the final layer"):
        ex.export(
            str(plain), str(tmp_path / "sf"), "specforge", final_state="last-layer", progress=False
        )
    data = torch.load(tmp_path / "sf/rows_0-2000/data_3.ckpt", weights_only=True)
    hs = stored_sample(9, 40)[2]
    assert torch.equal(data["hidden_state"][0], bf(hs[-1]))  # layers[-1] as the stand-in
    assert torch.equal(data["aux_hidden_state"][0], bf(torch.cat(hs, -1)))
    with pytest.warns(UserWarning):
        ex.export(
            str(plain), str(tmp_path / "s"), "speculators", final_state="last-layer", progress=False
        )
    assert load_file(tmp_path / "s/hidden_states/hs_0.safetensors")["hidden_states"].shape == (
        5,
        4,
        H,
    )


def test_resume_skips_finished_files_and_cleans_temporaries(src, tmp_path, monkeypatch):
    dest = tmp_path / "spec"
    real = ex._commit
    calls = []

    def dying(path, write):
        if path.name.startswith("hs_") and len(calls) == 3:
            write(ex._tmp_of(path))  # half-done: the temp exists, the rename never happens
            raise KeyboardInterrupt
        calls.append(path.name)
        return real(path, write)

    monkeypatch.setattr(ex, "_commit", dying)
    with pytest.raises(KeyboardInterrupt):  # one worker: the samples go in order
        ex.export(str(src), str(dest), "speculators", progress=False, workers=1)
    monkeypatch.setattr(ex, "_commit", real)
    hs_dir = dest / "hidden_states"
    assert sorted(p.name for p in hs_dir.iterdir()) == [
        ".hs_2.safetensors.tmp",
        "hs_0.safetensors",
        "hs_1.safetensors",
    ]
    assert not (dest / "state.json").exists()  # no Arrow dataset before all samples exist
    mtime = (hs_dir / "hs_0.safetensors").stat().st_mtime_ns
    c = ex.export(str(src), str(dest), "speculators", progress=False)
    assert c["written"] == 5 and c["skipped"] == 2
    assert (hs_dir / "hs_0.safetensors").stat().st_mtime_ns == mtime
    assert sorted(p.name for p in hs_dir.iterdir()) == [f"hs_{i}.safetensors" for i in range(7)]
    r = speculators_read(dest, 2)
    assert torch.equal(r["input_ids"], stored_sample(3, 9)[0])
    c = ex.export(str(src), str(dest), "speculators", progress=False)  # complete: no-op
    assert c == {"written": 0, "skipped": 7, "bytes": 0}


def test_workers_write_what_one_writes_and_a_failing_worker_stops_the_export(
    src, tmp_path, monkeypatch
):
    one = tmp_path / "one"
    ex.export(str(src), str(one), "speculators", progress=False, workers=1)
    real = ex.sample_writer
    seen = []

    def failing(fmt, rec, final, *kind):  # the fifth sample built fails, in whichever thread
        seen.append(rec["id"])
        if len(seen) == 5:
            raise OSError("disk full (test)")
        return real(fmt, rec, final, *kind)

    many = tmp_path / "many"
    monkeypatch.setattr(ex, "sample_writer", failing)
    with pytest.raises(OSError, match="disk full"):
        ex.export(str(src), str(many), "speculators", progress=False, workers=4)
    assert not (many / "state.json").exists()  # no Arrow dataset: the export is not complete
    assert not json.loads((many / "hsdump_export.json").read_text())["complete"]
    monkeypatch.setattr(ex, "sample_writer", real)
    c = ex.export(str(src), str(many), "speculators", progress=False, workers=4)
    assert c["written"] + c["skipped"] == 7 and c["skipped"] >= 1
    names = sorted(p.name for p in (one / "hidden_states").iterdir())
    assert names == sorted(p.name for p in (many / "hidden_states").iterdir())
    for n in names:  # byte for byte: the same file i for the same sample i
        a = (one / "hidden_states" / n).read_bytes()
        assert a == (many / "hidden_states" / n).read_bytes()
    assert torch.load(many / "token_freq.pt", weights_only=True) == torch.load(
        one / "token_freq.pt", weights_only=True
    )


def test_a_different_export_is_refused_and_overwrite_replaces_it(src, tmp_path):
    dest = tmp_path / "d"
    ex.export(str(src), str(dest), "specforge", progress=False)
    with pytest.raises(ex.ExportError, match="to: 'specforge' -> 'speculators-v1'"):
        ex.export(str(src), str(dest), "speculators-v1", progress=False)
    with pytest.raises(ex.ExportError, match="ids"):
        ex.export(str(src), str(dest), "specforge", max_len=10, progress=False)
    c = ex.export(str(src), str(dest), "specforge", max_len=10, overwrite=True, progress=False)
    assert c["written"] == 4 and len(specforge_list(dest)) == 4  # lengths 5, 9, 1, 7
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("mine")
    with pytest.raises(ex.ExportError, match="not empty"):
        ex.export(str(src), str(foreign), "specforge", overwrite=True, progress=False)
    assert (foreign / "x.txt").exists()


def test_fp8_source_exports_dequantized_bf16(tmp_path):
    samples = {sid: stored_sample(sid, n, final=("post_norm",)) for sid, n in LENS.items()}
    s = make_dataset(tmp_path / "s8", samples, storage="fp8")
    ex.export(str(s), str(tmp_path / "sf"), "specforge", progress=False)
    data = torch.load(tmp_path / "sf/rows_0-2000/data_3.ckpt", weights_only=True)
    want = HsdumpDataset(str(s)).get(9)
    assert data["aux_hidden_state"].dtype == torch.bfloat16
    assert torch.equal(data["aux_hidden_state"][0], torch.cat(want["hidden_states"], -1))


def test_cli(src, tmp_path, capsys):
    dest = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsdump",
            "export",
            str(src),
            str(dest),
            "--to",
            "speculators-v1",
            "--min-len",
            "9",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert "4 samples written" in p.stdout and "export speculators-v1" in p.stderr  # tqdm
    assert len(list(dest.glob("data_*.pt"))) == 4
    assert ex.main([str(src), str(dest), "--to", "specforge", "--no-progress"]) == 2
    assert "cannot resume" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------
# The peers' own loader code. hsdump's venv cannot install them (their pins clash with
# SGLang's), so their wheels are fetched with `pip download --no-deps` and unpacked into the
# hsdump cache on first use (HSDUMP_SPECULATORS03_SRC / HSDUMP_SPECFORGE_SRC point at an
# unpacked root instead). Only the loader file is executed; the package imports it does not
# need are stubbed.
PEER_WHEELS = {
    "HSDUMP_SPECULATORS03_SRC": "speculators==0.3.0",
    "HSDUMP_SPECULATORS06_SRC": "speculators==0.6.0",
    "HSDUMP_SPECFORGE_SRC": "specforge==0.2.0",
    "HSDUMP_SPECULATORS09_SRC": "speculators==0.9.0",
    "HSDUMP_HS_CONNECTORS_SRC": "hs-connectors==0.9.0",
    "HSDUMP_ACCELERATE_SRC": "accelerate==1.15.0",  # SpecForge's trainer (its DDP wrapper)
    "HSDUMP_SGLANG0517_SRC": "sglang==0.5.17",  # its model sources (tests/test_kinds.py)
}


def _peer_root(root_env) -> str:
    import zipfile

    root = os.environ.get(root_env)
    if root:
        return root
    req = PEER_WHEELS[root_env]
    cache = Path(os.environ.get("HSDUMP_CACHE", Path.home() / ".cache" / "hsdump"))
    dest = cache / "peers" / req.replace("==", "-")
    if (dest / ".done").exists():
        return str(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "-q",
            "--only-binary=:all:",
            req,
            "-d",
            str(tmp),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    wheels = list(tmp.glob("*.whl"))
    if p.returncode != 0 or not wheels:
        msg = f"cannot fetch {req} ({p.stderr.strip()[-300:]}); set {root_env}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tmp / "src")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp / "src", dest)
    (dest / ".done").write_text(req)
    shutil.rmtree(tmp, ignore_errors=True)  # the downloaded wheel
    return str(dest)


def _load_peer_file(root_env, rel, modname, stubs):
    import importlib.util
    import types

    root = _peer_root(root_env)
    saved = {k: sys.modules.get(k) for k in list(stubs) + [modname]}
    try:
        for name, attrs in stubs.items():
            m = types.ModuleType(name)
            m.__path__ = []
            m.__dict__.update(attrs)
            sys.modules[name] = m
        spec = importlib.util.spec_from_file_location(modname, Path(root) / rel)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_speculators_03_own_v1_dataset_reads_the_export(src, tmp_path):
    nt = _load_peer_file(
        "HSDUMP_SPECULATORS03_SRC",
        "speculators/train/noise_transforms.py",
        "speculators.train.noise_transforms",
        {"speculators": {}, "speculators.train": {}},
    )
    data = _load_peer_file(
        "HSDUMP_SPECULATORS03_SRC",
        "speculators/train/data.py",
        "speculators.train.data",
        {
            "speculators": {},
            "speculators.train": {},
            "speculators.train.noise_transforms": vars(nt),
        },
    )
    dest = tmp_path / "v1"
    ex.export(str(src), str(dest), "speculators-v1", progress=False)
    files = sorted(data.list_files(str(dest)), key=lambda p: int(p.stem.split("_")[1]))
    ds = data.Eagle3SampleFileDataset(
        max_len=64, file_list=files, hidden_states_dtype=torch.bfloat16
    )
    for i, sid in enumerate(sorted(LENS)):
        ids, mask, hs, fin = stored_sample(sid, LENS[sid], final=("pre_norm", "post_norm"))
        r = ds[i]  # standardize_data_v1, then shift_batch
        assert torch.equal(r["hidden_states"], bf(torch.cat(hs, -1))[:-1])
        assert torch.equal(r["verifier_last_hidden_states"], bf(fin["pre_norm"])[1:])
        assert torch.equal(r["input_ids"], ids[1:]) and torch.equal(r["loss_mask"], mask[1:])
    batch = data.create_collate_fn(64)([ds[0], ds[1]])
    assert batch["hidden_states"].shape == (1, 64, 3 * H)


def test_specforge_own_offline_dataset_reads_the_export(src, tmp_path):
    noop = lambda *a, **k: None  # noqa: E731
    pre = _load_peer_file(
        "HSDUMP_SPECFORGE_SRC",
        "specforge/data/preprocessing.py",
        "specforge.data.preprocessing",
        {
            "specforge": {},
            "specforge.data": {},
            "specforge.distributed": {"get_draft_sp_group": noop, "get_sp_ring_group": noop},
            "specforge.data.loss_mask": {"has_consecutive_supervised_tokens": noop},
            "specforge.data.parse": {
                "GeneralParser": None,
                "GLMParser": None,
                "HarmonyParser": None,
                "ThinkingParser": None,
            },
            "specforge.data.template": {"TEMPLATE_REGISTRY": {}, "ChatTemplate": None},
        },
    )
    dest = tmp_path / "sf"
    ex.export(str(src), str(dest), "specforge", progress=False)
    ds = pre.build_offline_eagle3_dataset(str(dest), max_len=16)
    assert len(ds) == 7
    # SpecForge sorts paths as strings: data_10 < data_2; map back through the file name
    for path, k in zip(ds.datapaths, range(len(ds))):
        i = int(Path(path).stem.split("_")[1])
        sid = sorted(LENS)[i]
        ids, mask, hs, fin = stored_sample(sid, LENS[sid], final=("pre_norm", "post_norm"))
        r = ds[k]
        m = min(LENS[sid], 16)
        assert torch.equal(r["hidden_state"][0], bf(torch.cat(hs, -1))[:m])
        assert torch.equal(r["target"][0], bf(fin["post_norm"])[:m])
        assert torch.equal(r["input_ids"][0], ids[:m])
        want = mask[:m].clone()
        want[-1] = 0  # process_data clears the last position
        assert torch.equal(r["loss_mask"][0], want)


def test_regenerated_conversations_export_as_messages(tmp_path):
    from hsdump.store.writer import DatasetWriter

    out = tmp_path / "ds"
    w = DatasetWriter(str(out), rows_manifest())
    convs = {
        3: [{"role": "user", "content": "q"}, {"role": "assistant", "content": "é a"}],
        9: [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}],
    }
    for sid, conv in convs.items():
        ids, mask, hs, _ = stored_sample(sid, 6)
        w.add(sid, ids, mask, hs, conversation=conv)
    w.close()
    c = ex.export(str(out), str(tmp_path / "msgs"), "messages", progress=False)
    assert c == {
        "written": 2,
        "skipped": 0,
        "bytes": (tmp_path / "msgs" / ex.MESSAGES).stat().st_size,
    }
    rows = [json.loads(x) for x in (tmp_path / "msgs" / ex.MESSAGES).read_text().splitlines()]
    assert rows == [{"id": 3, "messages": convs[3]}, {"id": 9, "messages": convs[9]}]
    # what an extraction reads back as its own input (the messages row format)
    from hsdump.corpus.formats import row_to_sample

    assert row_to_sample(rows[0], "messages", "messages")[0] == convs[3]
    plain = tmp_path / "plain"
    w = DatasetWriter(str(plain), rows_manifest())
    w.add(0, *stored_sample(0, 4)[:3])
    w.close()
    with pytest.raises(ex.ExportError, match="no regenerated conversations"):
        ex.export(str(plain), str(tmp_path / "none"), "messages", progress=False)


# -------------------------------------------------------------------------------------------
# Drafter kinds: one capture of the union of EAGLE-3's, DFlash's and DSpark's layers (an
# 8-layer Llama: [2, 4, 5] and [2, 3, 4, 5, 6]) with both final states, exported per kind and
# read by the peers' own packages, imported whole from their wheels (SpecForge 0.2.0's
# algorithm registry, offline reader, feature store and normalizers, as its trainer builds
# them; speculators 0.9.0's ArrowDataset with hs-connectors 0.9.0's FileTransfer).
KIND_LAYERS = [2, 4, 5, 3, 6]
KLENS = {0: 5, 2: 17, 3: 9, 9: 40, 12: 12}


def kind_sample(sid, n):
    g = torch.Generator().manual_seed(100 + sid)
    ids = torch.randint(0, 100, (n,), generator=g)
    mask = torch.tensor([0] * (n // 2) + [1] * (n - n // 2))
    hs = {k: torch.randn(n, H, generator=g) for k in KIND_LAYERS}
    fin = {k: torch.randn(n, H, generator=g) for k in ("pre_norm", "post_norm")}
    return ids, mask, hs, fin


def kinds_dataset(path, kinds=("eagle3", "dflash", "dspark"), final=("pre_norm", "post_norm")):
    """A dataset as `capture=all_kinds` writes it for an 8-layer Llama (its manifest's kinds
    from hsdump.capture.kinds.record), or with fewer kinds/finals."""
    import dataclasses

    from hsdump.capture.kinds import KINDS, record
    from hsdump.store.writer import DatasetWriter

    per_kind = {k: sorted(KINDS[k].default_layers(8)) for k in kinds}
    layers = [k for k in KIND_LAYERS if any(k in v for v in per_kind.values())]
    m = rows_manifest(layers=layers, final=list(final), architecture="LlamaForCausalLM")
    m = dataclasses.replace(m, kinds=record(per_kind, "LlamaForCausalLM", "0.5.23"))
    w = DatasetWriter(str(path), m)
    for sid, n in KLENS.items():
        ids, mask, hs, fin = kind_sample(sid, n)
        w.add(sid, ids.tolist(), mask.tolist(), [hs[k] for k in layers], {f: fin[f] for f in final})
    w.close()
    return path


@pytest.fixture
def peers(monkeypatch):
    """Import the peers' wheels as packages: their roots on sys.path for this test, and their
    modules dropped from sys.modules afterwards (the other tests load single files of older
    releases under the same names)."""
    roots = []

    def add(*envs):
        for env in envs:
            roots.append(_peer_root(env))
            monkeypatch.syspath_prepend(roots[-1])

    yield add
    for name in list(sys.modules):
        if name.split(".")[0] in ("specforge", "speculators", "hs_connectors"):
            del sys.modules[name]


def specforge_loader(dest, kind, max_len=64):
    """SpecForge 0.2.0's offline training input for algorithm `kind`, built as its launch.py
    builds it: the algorithm's offline provider's reader (every file listed and, with
    SPECFORGE_VALIDATE_OFFLINE_FEATURES=1, opened and checked for its keys), a LocalFeatureStore
    and the FeatureDataLoader with the algorithm's normalizer and collator. Yields
    (file position, the batch's tensors)."""
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore

    provider = builtin_algorithm_registry().resolve(kind).providers.offline_for("text")
    refs = provider.build_reader(str(dest), run_id="t", ttt_length=1, max_len=max_len).read()
    assert len(refs) == len(KLENS) and all(r.feature_specs for r in refs)  # validated
    norm = provider.build_normalizer(max_len, ttt_length=1, use_usp_preprocess=False)
    loader = FeatureDataLoader(
        LocalFeatureStore("t"),
        refs=refs,
        batch_size=1,
        collate_fn=provider.build_collator(),
        per_sample_transform=norm,
        drop_last=False,
        strategy=kind,
        num_workers=0,
    )
    position = {r.sample_id: int(Path(r.feature_store_uri).stem.split("_")[1]) for r in refs}
    for batch in loader:  # a TrainBatch
        assert batch.strategy == kind and len(batch.sample_ids) == 1
        yield position[batch.sample_ids[0]], batch.tensors


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "domino", "dspark"])
def test_specforge_trains_each_kind_from_one_capture(kind, tmp_path, peers, monkeypatch):
    peers("HSDUMP_SPECFORGE_SRC")
    monkeypatch.setenv("SPECFORGE_VALIDATE_OFFLINE_FEATURES", "1")
    src = kinds_dataset(tmp_path / "src")
    dest = tmp_path / kind
    assert ex.export(str(src), str(dest), "specforge", kind=kind, progress=False)["written"] == 5
    want = [2, 4, 5] if kind == "eagle3" else [2, 3, 4, 5, 6]
    state = json.loads((dest / ex.STATE).read_text())
    assert state["kind"] == kind and state["kind_layers"] == want
    assert state["serving_ids"] == [k - 1 for k in want]  # Llama's setters add 1
    assert state["serving_ids_key"] == (
        "eagle_config.eagle_aux_hidden_state_layer_ids"
        if kind == "eagle3"
        else "dflash_config.target_layer_ids"
    )
    seen = 0
    for i, batch in specforge_loader(dest, kind):
        sid = sorted(KLENS)[i]
        ids, mask, hs, fin = kind_sample(sid, KLENS[sid])
        cat = bf(torch.cat([hs[k] for k in want], -1))
        assert torch.equal(batch["input_ids"][0], ids)
        if kind == "eagle3":
            assert torch.equal(batch["hidden_state"][0], cat)
            assert torch.equal(batch["target"][0], bf(fin["post_norm"]))
        else:
            assert torch.equal(batch["hidden_states"][0], cat)
            assert torch.equal(batch["loss_mask"][0], mask)
            if kind == "dspark":
                got = batch["target_last_hidden_states"][0]
                assert torch.equal(got, bf(fin["post_norm"]))
            else:
                assert "target_last_hidden_states" not in batch
        seen += 1
    assert seen == len(KLENS)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_speculators_09_reads_each_kind(kind, tmp_path, peers):
    peers("HSDUMP_SPECULATORS09_SRC", "HSDUMP_HS_CONNECTORS_SRC")
    from speculators.train.data import ArrowDataset

    src = kinds_dataset(tmp_path / "src")
    dest = tmp_path / kind
    ex.export(str(src), str(dest), "speculators", kind=kind, progress=False)
    want = [2, 4, 5] if kind == "eagle3" else [2, 3, 4, 5, 6]
    assert json.loads((dest / ex.STATE).read_text())["serving_ids"] == [k - 1 for k in want]
    ds = ArrowDataset(max_len=64, datapath=str(dest), on_missing="raise")
    assert len(ds) == len(KLENS)
    for i, sid in enumerate(sorted(KLENS)):
        ids, mask, hs, fin = kind_sample(sid, KLENS[sid])
        r = ds[i]
        assert torch.equal(r["hidden_states"], bf(torch.cat([hs[k] for k in want], -1)))
        assert torch.equal(r["verifier_last_hidden_states"], bf(fin["pre_norm"]))
        assert torch.equal(r["loss_mask"], mask)


def test_a_kind_the_capture_lacks_is_refused_naming_the_reextraction(tmp_path):
    only_eagle3 = kinds_dataset(tmp_path / "e3", kinds=("eagle3",), final=("post_norm",))
    with pytest.raises(
        ex.ExportError, match=r"not \[3, 6\] of dflash.*capture.kinds=\[eagle3,dflash\]"
    ):
        ex.export(str(only_eagle3), str(tmp_path / "d"), "specforge", kind="dflash", progress=False)
    no_post = kinds_dataset(tmp_path / "np", final=("pre_norm",))
    with pytest.raises(ValueError, match=r"capture.final=\[post_norm\]"):
        ex.export(str(no_post), str(tmp_path / "s"), "specforge", kind="dspark", progress=False)
    with pytest.raises(ex.ExportError, match="is the post-norm final state.*not 'pre_norm'"):
        ex.export(
            str(no_post),
            str(tmp_path / "s"),
            "specforge",
            kind="dspark",
            final_state="pre_norm",
            progress=False,
        )
    with pytest.raises(
        ex.ExportError,
        match="speculators takes --kind eagle3, dflash .SGLang refuses speculators-trained DSpark",
    ):
        ex.export(str(no_post), str(tmp_path / "x"), "speculators", kind="dspark", progress=False)
    for d in ("d", "s", "x"):
        assert not (tmp_path / d).exists()  # refused before DEST is made
    # DFlash needs no final state in SpecForge's records
    ex.export(str(no_post), str(tmp_path / "ok"), "specforge", kind="dflash", progress=False)
    # a dataset from before kinds were recorded: EAGLE-3 takes every layer, in their order,
    # as before; DFlash its default for the depth, and the serving ids from the class's rule
    mpath = only_eagle3 / "manifest.json"
    m = json.loads(mpath.read_text())
    del m["kinds"]
    mpath.write_text(json.dumps(m))
    assert (
        ex.export(str(only_eagle3), str(tmp_path / "e"), "specforge", progress=False)["written"]
        == 5
    )
    assert json.loads((tmp_path / "e" / ex.STATE).read_text())["serving_ids"] == [1, 3, 4]
    with pytest.raises(ex.ExportError, match=r"not \[3, 6\] of dflash"):
        ex.export(str(only_eagle3), str(tmp_path / "d"), "specforge", kind="dflash", progress=False)


def test_cli_prints_the_serving_ids(tmp_path, capsys):
    src = kinds_dataset(tmp_path / "src")
    dest = tmp_path / "d"
    argv = [str(src), str(dest), "--to", "specforge", "--kind", "dspark", "--no-progress"]
    assert ex.main(argv) == 0
    out = capsys.readouterr().out
    assert "(specforge, dspark): 5 samples written" in out
    assert (
        "serving ids [1, 2, 3, 4, 5]: put them in the drafter's config.json as dflash_config.target_layer_ids"
        in out
    )
    # another kind into the same DEST is another export
    assert ex.main([*argv[:4], "--kind", "dflash", "--no-progress"]) == 2
    assert "kind: 'dspark' -> 'dflash'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["dflash", "eagle3"])
def test_export_writes_the_states_in_the_dtype_asked(kind, tmp_path):
    """--dtype float32: SpecForge feeds its records to the drafter as stored, so a float32
    (CPU) drafter takes float32 records; the values are the stored ones, cast. An export of
    another dtype at DEST does not resume."""
    import hsdump.tools.export as ex

    ds = kinds_dataset(tmp_path / "ds")
    a, b = tmp_path / "as-stored", tmp_path / "f32"
    assert ex.main([str(ds), str(a), "--to", "specforge", "--kind", kind, "--no-progress"]) == 0
    assert ex.main([str(ds), str(b), "--to", "specforge", "--kind", kind, "--no-progress",
                    "--dtype", "float32"]) == 0  # fmt: skip
    files = sorted(p.relative_to(a) for p in a.rglob("*.ckpt"))
    assert files and files == sorted(p.relative_to(b) for p in b.rglob("*.ckpt"))
    floats = 0
    for rel in files:
        x = torch.load(a / rel, weights_only=True)
        y = torch.load(b / rel, weights_only=True)
        assert set(x) == set(y)
        for k, t in x.items():
            if t.is_floating_point():
                floats += 1
                assert t.dtype == torch.bfloat16 and y[k].dtype == torch.float32, k
                assert torch.equal(y[k], t.float()), k
            else:
                assert torch.equal(y[k], t), k
    assert floats >= len(files)
    assert json.loads((b / "hsdump_export.json").read_text())["dtype"] == "float32"
    with pytest.raises(ex.ExportError, match="dtype: 'float32' -> None"):
        ex.export(str(ds), str(b), "specforge", kind=kind, progress=False)


def test_a_record_promising_absent_samples_is_refused_before_anything_is_written(src, tmp_path):
    index = json.loads((src / "index.json").read_text())
    index["samples"]["777"] = "shard-00002.safetensors"  # the last shard lacks it
    (src / "index.json").write_text(json.dumps(index))
    dest = tmp_path / "d"
    with pytest.raises(Refusal, match=r"lists 1 sample it does not hold \(e.g. \[777\]\)"):
        ex.export(str(src), str(dest), "speculators-v1", progress=False)
    assert not dest.exists()
