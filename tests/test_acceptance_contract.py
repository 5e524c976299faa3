"""bench/acceptance/'s drafters reach SGLang the way SpecForge trains them (issue 43).

`python -m bench.acceptance contract` (run from the repository root as a subprocess: it runs
SpecForge's and SGLang's code) builds, for each kind on hsdump's tiny Llama, the drafter's config
with the serving ids hsdump records, SpecForge 0.2.0's own draft model from it, a checkpoint in its
trainer's layout and its own export (`export_to_sglang` for EAGLE-3, `export_to_hf` for DFlash and
DSpark), then loads each folder into SGLang 0.5.23's own class for its architecture on the CPU
(`python -m bench.acceptance.sglang_check`) and records every parameter its load_weights fills.
What this pins: every parameter of SGLang's DFlashDraftModel, DSparkDraftModel and
LlamaForCausalLMEagle3 is filled from SpecForge's export (SGLang skips a name it does not know and
keeps that parameter's initial values, silently), the layer ids SGLang reads are the serving ids,
the mask token is set, and SGLang refuses a DSpark config that carries its Markov head's fields
only under dflash_config (SpecForge's recipe layout), which is why the driver writes them at the
top level too. SpecForge's trainer itself is tests/test_acceptance_train.py's. Also here: the
package's CLIs as documented, and the pieces that need neither SpecForge nor SGLang
(`trainer-target`, `draft-config` for EAGLE-3), run in this process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from acceptance_helpers import cli, module
from factories import ROOT
from test_export import _peer_root


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """`contract` once for the module's tests: its exit status, its report, its folders."""
    tmp = tmp_path_factory.mktemp("contract")
    sf = _peer_root("HSDUMP_SPECFORGE_SRC")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([sf, os.environ.get("PYTHONPATH", "")]))
    env["HSDUMP_CACHE"] = os.environ.get("HSDUMP_CACHE", str(tmp / "cache"))
    p = subprocess.run(
        [sys.executable, "-m", "bench.acceptance", "contract", "--target", "tiny:llama",
         "--out", str(tmp / "c")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert p.returncode in (0, 1), p.stderr[-3000:]
    start = p.stdout.index("{\n")
    return p, json.loads(p.stdout[start:]), tmp / "c"


# the engine tier: SGLang's own drafter classes build and load the exports (SGLang decides)
@pytest.mark.engine
def test_specforge_exports_load_in_sglangs_drafter_classes(contract):
    p, r, _ = contract
    nbf = "eagle3-norm_before_fc-feed_post_norm"
    assert set(r) == {"dflash", "eagle3", "eagle3-fc_norm", nbf, "dspark", "dspark-nested",
                      "dspark-cap-accept"}, r  # fmt: skip
    for kind, cls in (("dflash", "DFlashDraftModel"), ("dspark", "DSparkDraftModel"),
                      ("eagle3", "LlamaForCausalLMEagle3")):  # fmt: skip
        x = r[kind]
        assert x["cls"] == cls and x["gaps"] == [], (kind, x)
        # tiny Llama (8 layers): DFlash/DSpark [2..6] and EAGLE-3 [2, 4, 5] in hsdump's
        # indices, served by Llama's +1 setters as these ids
        ids = [1, 3, 4] if kind == "eagle3" else [1, 2, 3, 4, 5]
        assert x["serving_ids"] == ids, x
        assert x.get("aux_ids" if kind == "eagle3" else "target_layer_ids") == ids, x
        shared = 1 if kind == "eagle3" else 0  # the draft's embedding is the target's
        assert x["loaded"] == x["params"] - shared, x
    for kind in ("dflash", "dspark"):
        assert r[kind]["block_size"] == 16 and r[kind]["mask_token_id"] is not None
    assert r["dspark-nested"]["refused_by_sglang"], r["dspark-nested"]
    # the confidence head, built in a ragged-verify mode, is filled from the export too
    cap = r["dspark-cap-accept"]
    assert cap["gaps"] == [] and cap["loaded"] == cap["params"] == r["dspark"]["params"] + 2, cap
    assert cap["confidence_head"] == ["confidence_head.proj.bias", "confidence_head.proj.weight"]
    # EAGLE-3 with an RMSNorm per captured layer before fc (--fc-norm): SGLang builds the three
    # norms from the config's fc_norm and fills them from SpecForge's export
    fc = r["eagle3-fc_norm"]
    assert fc["cls"] == "LlamaForCausalLMEagle3" and fc["gaps"] == [], fc
    assert fc["params"] == r["eagle3"]["params"] + 3 and fc["loaded"] == fc["params"] - 1, fc
    # SpecForge's drafter as trained (pre-norm state fed on, no norm over the concatenation) is
    # what SGLang builds from the plain config
    assert not r["eagle3"]["norm_before_fc"] and not r["eagle3"]["norm_output"], r["eagle3"]
    # --norm-before-fc --feed-post-norm (speculators' drafter): SGLang builds the one norm
    # (input_norm) and fills it from SpecForge's export, and feeds the normed state on
    x = r[nbf]
    assert x["cls"] == "LlamaForCausalLMEagle3" and x["gaps"] == [], x
    assert x["params"] == r["eagle3"]["params"] + 1 and x["loaded"] == x["params"] - 1, x
    assert x["norm_before_fc"] and x["norm_output"], x
    assert p.returncode == 0, p.stdout[-2000:]


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.5.17", "0.5.23"])
def test_dspark_config_reads_the_same_in_both_releases(contract, release, monkeypatch):
    """SGLang 0.5.17 reads DSpark's Markov fields from `dspark_config` or the top level, 0.5.23
    from `dflash_config` too; both build the heads from the top level. The export's config
    (SpecForge's own, from `draft_config`) is read by each release's own config reader and head
    builders (its source run by tests/release_code.py: 0.5.17's wheel, the venv's 0.5.23) to
    the same DSpark config, and its heads' tensors fill each release's heads exactly; the
    recipe's layout (fields under dflash_config only) is refused by both."""
    import sglang
    from release_code import dspark
    from safetensors import safe_open
    from transformers import AutoConfig

    _, _, out = contract
    if release == "0.5.17":
        root = Path(_peer_root("HSDUMP_SGLANG0517_SRC")) / "sglang" / "srt"
    else:
        assert sglang.__version__ == "0.5.23"
        root = Path(sglang.__file__).parent / "srt"
    code = dspark(root)
    served = out / "dspark" / "served"
    cfg = AutoConfig.from_pretrained(served)
    got = code["parse_dspark_draft_config"](draft_hf_config=cfg)
    assert (got.markov_rank, got.markov_head_type, got.gamma) == (256, "vanilla", 16), got
    assert got.target_layer_ids == [1, 2, 3, 4, 5] and got.mask_token_id == 1, got
    with safe_open(str(served / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}

    def filled(prefix, head):
        want = {k[len(prefix) :]: v for k, v in shapes.items() if k.startswith(prefix)}
        return want and want == {k: list(v.shape) for k, v in head.state_dict().items()}

    assert filled("markov_head.", code["build_markov_head"](cfg))
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE", raising=False)  # the default: static
    assert code["build_confidence_head"](cfg) is None  # no head; its tensors are skipped
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "cap-accept")
    assert filled("confidence_head.", code["build_confidence_head"](cfg))
    # the recipe's layout: 0.5.17's reader finds no Markov rank there, 0.5.23's finds it under
    # dflash_config; both build the head from the top level only, and refuse
    nested = AutoConfig.from_pretrained(out / "dspark" / "nested")
    rank = code["parse_dspark_draft_config"](draft_hf_config=nested).markov_rank
    assert rank == (0 if release == "0.5.17" else 256)
    with pytest.raises(ValueError, match="markov_rank"):
        code["build_markov_head"](nested)


@pytest.mark.engine
def test_untrained_drafter_is_the_contracts(contract, tmp_path):
    """`untrained` (the GPU run's smoke serve loads its folder) writes, into folders that do not
    exist yet, SpecForge's own export of an untrained DSpark drafter from a draft config: the
    config the contract's export has, and every tensor name and shape of it."""
    from safetensors import safe_open

    _, _, out = contract
    sf = _peer_root("HSDUMP_SPECFORGE_SRC")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([sf, os.environ.get("PYTHONPATH", "")]))
    served = tmp_path / "new" / "served"
    p = subprocess.run(
        [sys.executable, "-m", "bench.acceptance", "untrained", "--kind", "dspark",
         "--draft-config", str(out / "dspark" / "draft.json"), "--work", str(tmp_path / "new" / "w"),
         "--out", str(served)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    want = out / "dspark" / "served"
    assert json.loads((served / "config.json").read_text()) == json.loads(
        (want / "config.json").read_text()
    )

    def shapes(folder):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}

    got = shapes(served)
    assert got == shapes(want) and any(k.startswith("markov_head.") for k in got), sorted(got)


def test_the_clis_name_the_documented_subcommands():
    """`python -m bench.acceptance` and `python -m bench.acceptance.speculators` from the
    repository root: the subcommands bench/acceptance/README.md documents (those of the scripts
    they replace, and `trainer-target`), and `python -m bench.acceptance.specforge_cli` with no
    SpecForge arguments says how it is called, exit 2."""
    p = module("--help", timeout=120)
    assert p.returncode == 0, p.stderr
    subs = ("draft-config", "trainer-target", "train", "export", "predict", "disk-plan",
            "check-served", "contract", "untrained", "margins", "speedup", "table", "curves",
            "fit", "plan", "trace", "run-all")  # fmt: skip
    assert "{" + ",".join(subs) + "}" in p.stdout, p.stdout
    p = module("--help", name="bench.acceptance.speculators", timeout=120)
    assert p.returncode == 0, p.stderr
    subs = ("prepare", "build-target", "extract-unchecked", "train", "convert", "serve", "table",
            "run-all")  # fmt: skip
    assert "{" + ",".join(subs) + "}" in p.stdout, p.stdout
    p = module(name="bench.acceptance.specforge_cli", timeout=120)
    assert p.returncode == 2 and "[--cpu]" in p.stdout, (p.stdout, p.stderr)


def test_specforge_cli_takes_its_flags_before_specforges_arguments():
    """The runner's own flags are the leading ones; from SpecForge's first argument on,
    everything is SpecForge's (a `--cpu` after it is SpecForge's to read)."""
    from bench.acceptance.specforge_cli import split_args

    assert split_args(["--cpu", "--muon", "train", "--config", "r.yaml"]) == (
        ["--cpu", "--muon"], ["train", "--config", "r.yaml"])  # fmt: skip
    assert split_args(["train", "--cpu"]) == ([], ["train", "--cpu"])
    assert split_args(["--freeze-head"]) == (["--freeze-head"], [])


def _safetensors_target(dest: Path) -> Path:
    """A one-file checkpoint (no index), as SmolLM2's and tiny:llama's folders are."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2), "lm_head.weight": torch.ones(4, 2)},
              str(dest / "model.safetensors"))  # fmt: skip
    (dest / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return dest


def test_trainer_target_indexes_a_one_file_checkpoint(tmp_path):
    """`trainer-target`: SpecForge's trainer opens the target's weights through `*.index.json`
    only; the folder it prints links to every file of the target beside an index that maps each
    tensor to its file, and the target is left as it was. Again: the same folder. A target that
    has an index is its own trainer target."""
    target = _safetensors_target(tmp_path / "target")
    out = tmp_path / "new" / "tt"
    p = cli("trainer-target", "--target", target, "--out", out)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out)
    assert sorted(f.name for f in out.iterdir()) == [
        "config.json", "model.safetensors", "model.safetensors.index.json"]  # fmt: skip
    assert (out / "model.safetensors").resolve() == (target / "model.safetensors").resolve()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"model.embed_tokens.weight": "model.safetensors",
                                   "lm_head.weight": "model.safetensors"}  # fmt: skip
    assert sorted(f.name for f in target.iterdir()) == ["config.json", "model.safetensors"]
    assert cli("trainer-target", "--target", target, "--out", out).stdout.strip() == str(out)
    p = cli("trainer-target", "--target", out, "--out", tmp_path / "other")
    assert p.stdout.strip() == str(out.resolve()) and not (tmp_path / "other").exists()


def test_draft_config_makes_its_folder(tmp_path):
    """`draft-config --out` into a folder that does not exist yet: the folder is made and the
    EAGLE-3 drafter's config written there on the export's serving ids (its draft vocabulary
    the target's first 32,000 rows at most; its options only where asked)."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(dict(
        num_attention_heads=4, hidden_size=64, intermediate_size=128,
        max_position_embeddings=2048, rms_norm_eps=1e-5, vocab_size=40000,
        num_hidden_layers=8)))  # fmt: skip
    ex = tmp_path / "ex"
    ex.mkdir()
    (ex / "hsdump_export.json").write_text(json.dumps(dict(kind="eagle3", serving_ids=[1, 3, 4])))
    out = tmp_path / "new" / "folder" / "draft.json"
    p = cli("draft-config", "--kind", "eagle3", "--target", target, "--export", ex, "--out", out,
            "--fc-norm")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == dict(out=str(out), ids=[1, 3, 4], arch="LlamaForCausalLMEagle3")
    c = json.loads(out.read_text())
    assert c["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}
    assert (c["draft_vocab_size"], c["head_dim"], c["num_hidden_layers"]) == (32000, 16, 1)
    assert c["fc_norm"] and "norm_before_fc" not in c and "feed_post_norm" not in c
