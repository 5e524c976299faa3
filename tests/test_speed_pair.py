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

H = 64  # the model's width in these reports: a bf16 state is 128 bytes a token


def reports(ids, sf_ids=None, *, fsync=True, sf_backend="triton", sf_session="call-1",
            final=("post_norm",)):  # fmt: skip
    """hsdump capturing 3 layers and `final`; SpecForge's EAGLE-3 records: 3 layers and the
    final state (4 states a token), each with a few bytes of ids and mask."""
    host = {"hostname": "h200", "boot_id": "b-1", "session": "call-1"}
    hs = {
        "env": {"sglang": "0.5.17", "torch": "2.11.0", "gpu": "NVIDIA H200", "host": host,
                "date": "2026-12-04T09:00:00+00:00"},
        "engine_config": {"attention_backend": "triton", "disable_cuda_graph": True},
        "runs": {"llama8b:2048": {
            "model": "llama8b", "seq": 4, "samples": len(ids), "layers": [2, 16, 29],
            "final": list(final), "hidden_size": H,
            "weights": "dummy", "ids_sha256": speed.ids_digest(ids),
            "a": {"tokens_per_s": 40000.0},
            "b": {"b": {"tokens_per_s": 38000.0, "tokens": 4 * len(ids), "wall_s": 1.0,
                        "bytes_per_token": (3 + len(final)) * 2 * H + 16}},
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
                   "seconds_forward": 0.1, "fsync": fsync,
                   "bytes": 4 * len(sf_ids) * (4 * 2 * H + 17), "files": len(sf_ids),
                   # its first batch carries the warm-up: the forward alone is over the rest
                   "batches": [{"tokens": 4, "seconds_capture": 5.0}]
                   + [{"tokens": 4, "seconds_capture": 0.0001}] * (len(sf_ids) - 1)},
    }  # fmt: skip
    return hs, sf


def run(tmp_path, hs, sf, *flags):
    (tmp_path / "hs.json").write_text(json.dumps(hs))
    (tmp_path / "sf.json").write_text(json.dumps(sf))
    out = tmp_path / "pair.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "speed_pair.py"), "--hsdump", str(tmp_path / "hs.json"),
         "--specforge", str(tmp_path / "sf.json"), "--out", str(out), *flags],
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
    assert got["same_data"] is True and got["states_per_token"] == {"hsdump": 4, "specforge": 4}
    # the forward alone over the steady batches, not the warm-up's 5 s
    assert got["specforge"]["tokens_per_s_forward_only"] == 40000.0
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


def test_unequal_data_is_refused_unless_allowed_and_then_said(tmp_path):
    """hsdump capturing the layers alone (3 states a token) beside SpecForge's records with the
    final state too (4) is not the same work: refused with the fix; with --allow-unequal-data
    the file says so and keeps the rate per byte beside the ratio."""
    ids = models.bench_ids(3, 4, 100)
    hs, sf = reports(ids, final=())
    p, out = run(tmp_path, hs, sf)
    assert p.returncode != 0 and not out.exists()
    assert "hsdump writes 3 states a token" in p.stderr and "SpecForge 4" in p.stderr
    assert "--final post_norm" in p.stderr
    p, out = run(tmp_path, hs, sf, "--allow-unequal-data")
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())
    assert got["same_data"] is False and got["ratio"] == 3.8
    # 38,000 tok/s of 3 states (+16 bytes) against 10,000 of 4 (+17)
    assert got["ratio_per_byte"] == round(38000 * 400 / (10000 * 529), 3)
    assert "same data: False" in p.stdout
