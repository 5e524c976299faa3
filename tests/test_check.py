"""`hsdump check OUT` (hsdump.tools.check, hsdump.check) and the in-run final-state check
(`check.logprob_samples`, hsdump.check_final).

One real extraction of the embedded default (SGLang's CPU engine, the tiny Llama) with both final
states and the in-run check on two samples: `hsdump check` passes on it, and fails on the same
rows under a manifest whose layers are shifted by one or swapped; its final_check/main.json says
the loss from the captured final state equals SGLang's own. SmolLM2's real weights are checked the
same way in tests/test_smollm2.py. Without an engine: the refusals, and the LM head and final
norm read from the checkpoint's safetensors against transformers' own.
"""

import json
import shutil

import harness
import pytest
import torch
from factories import ROOT

from hsdump import check as c
from hsdump import check_final
from hsdump.store.layout import FORMAT
from hsdump.tools import check as tool


def hsdump_check(*args):
    return harness.hsdump("check", *map(str, args), timeout=600, split=True)


# --------------------------------------------------------------------------- no engine
def test_refusals_before_torch(tmp_path):
    rc, out, err = hsdump_check(tmp_path)
    assert rc == 2 and "manifest.json" in err and "Traceback" not in err, err
    rc, out, err = hsdump_check(tmp_path, "--ids", "a,b")
    assert rc == 2 and "--ids 'a,b'" in err, err


def test_a_dry_dataset_is_refused(tmp_path):
    """engine=dry's rows are a function of the token ids: refused before torch, exit 2."""
    (tmp_path / "manifest.json").write_text(json.dumps({"format": FORMAT, "engine": "dry"}))
    with pytest.raises(ValueError, match="engine=dry.*extract again with a real engine"):
        tool.check(str(tmp_path))
    rc, out, err = hsdump_check(tmp_path)
    assert rc == 2 and "engine=dry" in err, err


def test_the_in_run_check_needs_a_final_state():
    from factories import compose_config

    from hsdump.config import register_configs, to_config

    register_configs()
    with pytest.raises(ValueError, match=r"add capture.final=\[pre_norm\]"):
        to_config(compose_config("check.logprob_samples=2", "output.dir=/tmp/x"))
    with pytest.raises(ValueError, match="check.logprob_samples=-1"):
        to_config(compose_config("check.logprob_samples=-1", "output.dir=/tmp/x"))
    cfg = to_config(compose_config("check.logprob_samples=2", "capture.final=[post_norm]"))
    assert cfg.check.logprob_samples == 2


def test_checkpoint_head_is_transformers(tiny_llama):
    """The LM head and final norm read from the safetensors alone turn transformers' own final
    states into transformers' own logits (pre_norm through the norm, post_norm directly)."""
    head, facts = check_final.checkpoint_head(tiny_llama)
    assert facts["norm"] == "model.norm.weight" and not facts["plus_one"], facts
    model = c.reference_model(tiny_llama, torch.float32)
    ids = list(range(5, 45))
    f = c.forward(model, ids, "cpu")
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0]
    for kind in ("pre_norm", "post_norm"):
        got = head.logits(getattr(f, kind), kind)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), kind
        lps = check_final.token_logprobs(head, getattr(f, kind), kind, ids, chunk=7)
        assert abs(-sum(lps) / len(lps) - f.loss) < 1e-4
    # the rule: within LOGPROB_EPS of the engine's loss passes, beyond it fails
    rec = {"id": 3, "input_ids": torch.tensor(ids), "final": {"pre_norm": f.pre_norm}}
    own = [None] + check_final.token_logprobs(head, f.pre_norm, "pre_norm", ids)
    assert check_final.compare(head, "pre_norm", rec, own)["ok"]
    off = [None] + [x - 2 * c.LOGPROB_EPS for x in own[1:]]
    assert not check_final.compare(head, "pre_norm", rec, off)["ok"]


# --------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The embedded default through SGLang's CPU engine, once: layers [2, 4, 5], both final
    states, and the in-run check of its first two samples."""
    out = tmp_path_factory.mktemp("check") / "tiny"
    rc, log = harness.extract(
        "dataset.max_samples=4",
        "capture.final=[pre_norm,post_norm]",
        "check.logprob_samples=2",
        out=out,
    )
    assert rc == 0, log[-4000:]
    return out, log


def relabelled(src, dest, layers):
    """A copy of dataset `src` whose manifest claims `layers` for the same rows."""
    shutil.copytree(src, dest)
    m = json.loads((dest / "manifest.json").read_text())
    m["layers"] = layers
    (dest / "manifest.json").write_text(json.dumps(m))
    return dest


@pytest.mark.engine
def test_check_passes_on_the_embedded_default(tiny_run):
    out, _ = tiny_run
    rc, text, err = hsdump_check(out)
    assert rc == 0, text + err
    assert text.splitlines()[-1] == "ok" and "layer 5" in text and "final/post_norm" in text
    rep = tool.check(str(out), samples=3)
    assert rep["ok"] and [r["index"] for r in rep["layers"]] == [2, 4, 5]
    for r in rep["layers"]:
        assert r["neighbour"] == "right" and all(b == r["index"] for b in r["best"]), r
        assert max(r["err"]) < 0.02, r
    assert [r["kind"] for r in rep["final"]] == ["pre_norm", "post_norm"]
    for r in rep["final"]:
        assert all(abs(a - b) < 0.01 for a, b in zip(r["loss"], r["loss_fp32"])), r
    print("hsdump check, embedded default:\n" + text)


@pytest.mark.engine
def test_check_fails_on_shifted_or_swapped_layers(tiny_run, tmp_path):
    out, _ = tiny_run
    shifted = relabelled(out, tmp_path / "shifted", [1, 3, 4])  # rows of [2, 4, 5]
    rc, text, err = hsdump_check(shifted, "--samples", "2")
    assert rc == 1 and text.splitlines()[-1].startswith("FAILED"), text + err
    rep = tool.check(str(shifted), samples=2)
    assert not rep["ok"]
    for r, real in zip(rep["layers"], [2, 4, 5]):
        assert not r["ok"] and r["neighbour"] == f"matches {real}", r
    assert all(r["ok"] for r in rep["final"])  # the final states are where they were
    swapped = relabelled(out, tmp_path / "swapped", [4, 2, 5])
    rep = tool.check(str(swapped), samples=1)
    assert [r["ok"] for r in rep["layers"]] == [False, False, True], rep["layers"]
    assert [r["neighbour"] for r in rep["layers"][:2]] == ["matches 2", "matches 4"]


@pytest.mark.engine
def test_in_run_final_state_check(tiny_run):
    import jsonschema

    out, log = tiny_run
    res = json.loads((out / "final_check" / "main.json").read_text())
    schema = json.loads((ROOT / "docs" / "schema" / "final-check.schema.json").read_text())
    jsonschema.validate(res, schema)
    assert res["ok"] and res["final"] == "pre_norm" and len(res["samples"]) == 2, res
    for s in res["samples"]:
        assert abs(s["loss"] - s["engine_loss"]) <= c.LOGPROB_EPS, s
    assert "final-state check" in log and "-> ok" in log, log[-3000:]
    print("in-run final-state check, embedded default:", json.dumps(res["samples"]))
    rc, out_, err = harness.hsdump("verify", out, split=True)
    assert rc == 0 and "final_check" not in out_ + err, out_ + err
