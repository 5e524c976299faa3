"""bench/speed_pair.py (issue 54): hsdump's and SpecForge's capture speed become one results
file only when the two runs timed the same prompt ids, count, layers, attention backend and
durability; `same_host_session` only when both name the same host, boot and call. The runs'
reports are built here in the shape bench/bench.py and reference_capture.py speed write (both
record `ids_digest` of their prompts and `host_identity()`, hsdump.testing.speed); the script
runs as a script."""

import json
import subprocess
import sys

from factories import ROOT

from hsdump.testing import models, speed


def reports(ids, sf_ids=None, *, fsync=True, sf_backend="triton", sf_session="call-1"):
    host = {"hostname": "h200", "boot_id": "b-1", "session": "call-1"}
    hs = {
        "env": {"sglang": "0.5.17", "torch": "2.11.0", "gpu": "NVIDIA H200", "host": host,
                "date": "2026-12-04T09:00:00+00:00"},
        "engine_config": {"attention_backend": "triton", "disable_cuda_graph": True},
        "runs": {"llama8b:2048": {
            "model": "llama8b", "seq": 4, "samples": len(ids), "layers": [2, 16, 29],
            "weights": "dummy", "ids_sha256": speed.ids_digest(ids),
            "a": {"tokens_per_s": 40000.0},
            "b": {"b": {"tokens_per_s": 38000.0, "tokens": 4 * len(ids), "wall_s": 1.0}},
        }},
    }  # fmt: skip
    sf_ids = ids if sf_ids is None else sf_ids
    sf = {
        "shape": "llama8b", "hf_hidden_states_index": [2, 16, 29],
        "sglang_layer_ids": [1, 15, 28], "ids_sha256": speed.ids_digest(sf_ids),
        "server_args": {"attention_backend": sf_backend}, "gpu": "NVIDIA H200",
        "versions": {"specforge": "0.2.0", "sglang": "0.5.14"},
        "host": dict(host, session=sf_session),
        "timing": {"samples": len(sf_ids), "tokens": 4 * len(sf_ids), "batch": 2,
                   "tokens_per_s_steady": 10000.0, "tokens_per_s_whole_run": 5000.0,
                   "seconds_forward": 0.1, "fsync": fsync, "bytes": 1, "files": len(sf_ids)},
    }  # fmt: skip
    return hs, sf


def run(tmp_path, hs, sf):
    (tmp_path / "hs.json").write_text(json.dumps(hs))
    (tmp_path / "sf.json").write_text(json.dumps(sf))
    out = tmp_path / "pair.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "speed_pair.py"), "--hsdump", str(tmp_path / "hs.json"),
         "--specforge", str(tmp_path / "sf.json"), "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    return p, out


def test_a_pair_is_one_file_with_both_rates(tmp_path):
    ids = models.bench_ids(3, 4, 100)
    p, out = run(tmp_path, *reports(ids))
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())
    assert got["hsdump"]["tokens_per_s"] == 38000.0
    assert got["specforge"]["tokens_per_s"] == 10000.0  # steady, not the whole run's 5,000
    assert got["specforge"]["tokens_per_s_whole_run"] == 5000.0
    assert got["same_host_session"] is True and got["ratio"] == 3.8
    assert got["hsdump"]["plain_prefill_tokens_per_s"] == 40000.0
    assert "| hsdump | 38,000 |" in p.stdout


def test_what_differs_is_refused_by_name(tmp_path):
    ids = models.bench_ids(3, 4, 100)
    other = models.bench_ids(3, 4, 101)  # other ids: a different digest
    assert speed.ids_digest(ids) != speed.ids_digest(other)
    p, out = run(tmp_path, *reports(ids, other))
    assert p.returncode != 0 and "prompt ids" in p.stderr and not out.exists()
    p, _ = run(tmp_path, *reports(ids, ids[:2]))
    assert "sample count" in p.stderr
    p, _ = run(tmp_path, *reports(ids, sf_backend="flashinfer"))
    assert "attention backend: hsdump 'triton', SpecForge 'flashinfer'" in p.stderr
    p, _ = run(tmp_path, *reports(ids, fsync=False))
    assert "durability" in p.stderr and "--fsync" in p.stderr


def test_another_call_is_not_the_same_session(tmp_path):
    ids = models.bench_ids(2, 4, 100)
    p, out = run(tmp_path, *reports(ids, sf_session="call-2"))
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["same_host_session"] is False
