"""Drafter kinds (hsdump.capture.kinds): their layers, the union one capture holds, the
manifest's record, the per-class serving-id rules (hsdump.capture.families.KIND_RULES) against
SGLang's own capture and code, and the refusals.

The engine tests start SGLang without hsdump's patch (tests/kind_probe.py): SGLang's own setter
maps the serving ids, and its rows are compared with transformers at the indices hsdump says
those ids serve.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from factories import ROOT, compose_config, hf_hidden_states
from harness import DRY, extract
from safetensors.torch import load_file
from test_export import _peer_root
from tolerance import rel_err

from hsdump.capture import kinds as K
from hsdump.capture.families import (
    FAMILIES,
    KIND_CPU_TEST,
    KIND_RULES,
    V17,
    V23,
    IdRule,
    check_kinds,
    family_of,
    kind_rule,
)
from hsdump.config import CaptureConfig, register_configs, to_config

K_NONE = IdRule("X.set_dflash_layers_to_capture", "none", "a test's")


def cap(**kw) -> CaptureConfig:
    return CaptureConfig(**kw)


def own_function(path, name):
    """Function `name` as written in the source file `path` (executed alone: its module's
    imports are not needed by it)."""
    import ast

    tree = ast.parse(Path(path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"List": list}
    exec(compile(ast.Module([node], []), str(path), "exec"), scope)
    return scope[name]


def test_dflash_default_is_specforge_and_sglang_build_target_layer_ids():
    import importlib.util

    sf = Path(_peer_root("HSDUMP_SPECFORGE_SRC")) / "specforge/modeling/draft/dflash.py"
    sg = Path(importlib.util.find_spec("sglang").origin).parent / "srt/speculative/dflash_utils.py"
    for build_target_layer_ids in (
        own_function(sf, "build_target_layer_ids"),
        own_function(sg, "build_target_layer_ids"),
    ):
        for L in range(4, 129):
            for n in (1, 3, 5, 8):
                assert K.build_target_layer_ids(L, n) == build_target_layer_ids(L, n), (L, n)
    assert K.build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B, SpecForge's config
    assert K.dflash_default(36) == [2, 10, 18, 26, 34]  # hf_hidden_states_index
    assert K.dflash_default(30) == [2, 9, 15, 21, 28]  # SmolLM2-135M: ids [1, 8, 14, 20, 27]
    assert K.KINDS["eagle3"].default_layers(30) == [2, 15, 27]


def test_union_of_kinds_and_their_finals():
    c = cap(kinds=["eagle3", "dflash", "dspark"])
    assert c.final == ["post_norm"]  # DSpark's trainer reads the post-norm state
    layers, per = K.capture_layers(c, None, 8)
    assert per == {"eagle3": [2, 4, 5], "dflash": [2, 3, 4, 5, 6], "dspark": [2, 3, 4, 5, 6]}
    assert layers == [2, 4, 5, 3, 6]  # eagle3's first, then the new ones
    assert cap(kinds=["dspark"], final=["pre_norm"]).final == ["pre_norm", "post_norm"]
    # one kind: explicit layers are its layers (as before kinds), the preset's are EAGLE-3's
    assert K.capture_layers(cap(layers=[5, 1]), None, 8) == ([5, 1], {"eagle3": [1, 5]})
    assert K.capture_layers(cap(), [3, 31, 59], 61)[0] == [3, 31, 59]
    # a kind's own layers
    c = cap(kinds=["eagle3", "dflash"], kind_layers={"dflash": [6, 2, 4]})
    assert K.capture_layers(c, None, 8) == (
        [2, 4, 5, 6],
        {"eagle3": [2, 4, 5], "dflash": [2, 4, 6]},
    )


def test_kind_layers_on_the_command_line():
    """`capture.kind_layers.<kind>=[...]` as the docs write it (no leading `+`): every kind's key
    is in conf/capture/default.yaml, null meaning the kind's default."""
    register_configs()
    c = to_config(
        compose_config("capture.kinds=[eagle3,dflash]", "capture.kind_layers.dflash=[6,2,4]")
    ).capture
    assert c.kind_layers == {"dflash": [6, 2, 4]}
    assert K.capture_layers(c, None, 8)[1]["dflash"] == [2, 4, 6]
    assert to_config(compose_config()).capture.kind_layers == {}


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match=r"capture.kinds=\['medusa'\].*eagle3, dflash, dspark"):
        cap(kinds=["medusa"])
    with pytest.raises(ValueError, match="capture.kind_layers names.*add it to capture.kinds"):
        cap(kind_layers={"dflash": [2]})
    c = cap(kinds=["eagle3", "dflash"], layers=[2, 4, 5])
    with pytest.raises(
        ValueError, match=r"lacks \[3, 6\] of dflash.*capture.layers=\[2, 3, 4, 5, 6\]"
    ):
        K.capture_layers(c, None, 8)
    # a model too shallow for DFlash's spread of 5
    with pytest.raises(ValueError, match=r"dflash's default.*repeats.*capture.kind_layers.dflash"):
        K.capture_layers(cap(kinds=["dflash"]), None, 6)
    with pytest.raises(ValueError, match="out of range"):
        K.capture_layers(cap(kinds=["eagle3", "dflash"], kind_layers={"dflash": [2, 8]}), None, 8)


def test_serving_ids_per_rule():
    llama = kind_rule("LlamaForCausalLM", "dflash", V23)
    assert K.serving_ids(llama, [2, 10, 18, 26, 34]) == [1, 9, 17, 25, 33]
    ds = kind_rule("DeepseekV3ForCausalLM", "eagle3", V23)
    assert ds.shift == "first_id_1"
    assert K.serving_ids(ds, [3, 31, 59]) == [3, 31, 59]  # Kimi-K2.5's preset: no shift
    assert K.serving_ids(ds, [2, 31, 59]) == [1, 30, 58]  # first id 1: every id shifts
    assert K.serving_ids(ds, [1, 31, 59]) is None  # id 1 would be shifted: not servable
    assert kind_rule("DeepseekV3ForCausalLM", "dflash", V23).shift == "plus1"  # always shifts
    assert K.serving_ids(kind_rule("Qwen3_5ForCausalLM", "dflash", V23), [2, 5]) == [1, 4]
    assert K.serving_ids(K_NONE, [2, 5]) == [2, 5]  # a class taking the stack's own indices
    for arch, rules in [*KIND_RULES[V23].items(), *KIND_RULES[V17].items()]:
        for kind, rule in rules.items():  # every rule maps its ids back to the layers
            for layers in ([2, 3, 4], [2, 15, 27], [3, 31, 59], [5, 9]):
                ids = K.serving_ids(rule, layers)
                assert ids is None or K.layers_of(ids, rule) == layers, (arch, kind)


def test_kind_gate():
    # every verified class whose SGLang 0.5.23 class has a DFlash setter has a rule for both
    # DFlash-family kinds; the classes without one are refused for them
    check_kinds("LlamaForCausalLM", ["eagle3", "dflash", "dspark"], False, "0.5.23")
    for arch in ("Qwen2ForCausalLM", "Glm4MoeForCausalLM", "MiniMaxM2ForCausalLM"):
        assert family_of(arch) is not None
        with pytest.raises(ValueError, match=f"dflash.*{arch}.*capture.allow_unverified=true"):
            check_kinds(arch, ["eagle3", "dflash"], False, "0.5.23")
        check_kinds(arch, ["eagle3"], False, "0.5.23")  # EAGLE-3 stays the family gate's
        check_kinds(arch, ["dflash"], True, "0.5.23")
    # a rule holds for the release it was read on
    with pytest.raises(ValueError, match="dspark.*SGLang 0.5.14"):
        check_kinds("LlamaForCausalLM", ["dspark"], False, "0.5.14")
    check_kinds("LlamaForCausalLM", ["dspark"], False, "0.5.17")  # read on 0.5.17 too
    check_kinds("LlamaForCausalLM", ["dspark"], False, None)  # engine=dry: the class only


def test_manifest_records_kinds_on_the_dry_engine(tmp_path):
    out = tmp_path / "ds"
    rc, log = extract(DRY, "capture=all_kinds", "dataset.max_samples=3", out=out, timeout=300)
    assert rc == 0, log[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["layers"] == [2, 4, 5, 3, 6] and m["final"] == ["pre_norm", "post_norm"]
    kinds = m["kinds"]
    assert sorted(kinds) == ["dflash", "dspark", "eagle3"]
    assert kinds["eagle3"]["layers"] == [2, 4, 5] and kinds["eagle3"]["serving_ids"] == [1, 3, 4]
    assert kinds["dflash"]["serving_ids"] == [1, 2, 3, 4, 5]
    assert kinds["dflash"]["setter"] == "LlamaForCausalLM.set_dflash_layers_to_capture"
    assert kinds["dflash"]["checked"].startswith(KIND_CPU_TEST)
    assert kinds["dspark"]["algorithm"] == "DSPARK" and kinds["dspark"]["finals"] == ["post_norm"]
    # the composed config: capture=all_kinds is a config group option
    register_configs()
    cfg = to_config(compose_config("capture=all_kinds"))
    assert cfg.capture.kinds == ["eagle3", "dflash", "dspark"]
    # the default folder names the kinds: a sweep over capture.kinds never shares one
    assert cfg.output.dir == "outputs/tiny-llama/layers-eagle3-dflash-dspark"
    kimi = to_config(compose_config("model=kimi_k25", "capture.kinds=[eagle3,dflash]"))
    assert kimi.output.dir == "outputs/kimi-k2.5/layers-3-31-59-dflash"


def test_explicit_layers_that_miss_a_kind_are_refused_before_the_engine(tmp_path):
    rc, log = extract(
        DRY, "capture.kinds=[eagle3,dflash]", "capture.layers=[2,4,5]", out=tmp_path / "x"
    )
    assert rc == 2 and "capture.layers=[2, 3, 4, 5, 6] captures every kind's" in log
    assert "Traceback" not in log  # a refusal (hsdump.errors.Refusal), not a failure
    assert not (tmp_path / "x" / "manifest.json").exists()


# ------------------------------------------------------------------ SGLang's own conventions
def probe(model: str, kind: str, ids, tmp_path, device: str = "cpu") -> dict:
    """tests/kind_probe.py's rows (`rows/{j}`, `ids/{j}`) for the serving `ids` of `kind`."""
    out = tmp_path / f"{kind}.safetensors"
    script = str(ROOT / "tests" / "kind_probe.py")
    p = subprocess.run(
        [sys.executable, script, str(model), kind, json.dumps(ids), str(out), device],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    return load_file(out)


@pytest.mark.engine
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "model_fixture, arch, kind",
    [("tiny_llama", "LlamaForCausalLM", "dflash"), ("tiny_qwen3", "Qwen3ForCausalLM", "dspark")],
)
def test_sglang_serves_the_kind_from_the_layers_hsdump_names(
    model_fixture, arch, kind, request, tmp_path
):
    """SGLang in its capture-only mode with the kind's convention and the serving ids hsdump
    writes for the class: its rows are transformers' hidden_states at hsdump's layers (and not
    at the neighbours), so a drafter trained on hsdump's export is served what it trained on."""
    model = request.getfixturevalue(model_fixture)
    rule = kind_rule(arch, kind, V23)
    assert rule.where.startswith(KIND_CPU_TEST)  # the rule this test backs
    layers = K.dflash_default(8)
    ids = K.serving_ids(rule, layers)
    assert ids == [1, 2, 3, 4, 5]
    got = probe(model, kind, ids, tmp_path)
    for j in range(2):
        ref = hf_hidden_states(model, got[f"ids/{j}"].tolist())
        rows = got[f"rows/{j}"]
        H = ref[0].shape[-1]
        assert rows.shape == (len(got[f"ids/{j}"]), len(layers) * H)
        for b, k in enumerate(layers):
            block = rows[:, b * H : (b + 1) * H]
            err = rel_err(block, ref[k])
            assert err < 0.02, (k, err)  # bf16 engine against float32 (0.004-0.006 seen)
            assert min(rel_err(block, ref[k - 1]), rel_err(block, ref[k + 1])) > 10 * err


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_recorded_setters_are_sglangs():
    """The code reading KIND_RULES records, checked against the installed SGLang: for each
    architecture, the class that owns the method SGLang calls for each kind, and its shift (the
    `val + 1` of a +1 setter, the first-id test of DeepSeek-V2's EAGLE-3 setter); and that no
    verified class has a DSpark hook of its own (DSPARK then goes to its DFlash setter). The
    class is the one SGLang registers (the file whose EntryClass names it); a module the CPU
    build cannot import is read from its source."""
    script = r"""
import importlib, inspect, json, re, sys
from pathlib import Path
from hsdump.capture.patch import prepare_process
prepare_process("cpu")
import sglang
models = Path(sglang.__file__).parent / "srt" / "models"
from hsdump.capture.families import KIND_RULES
sys.path.insert(0, "tests")
from setters import entry_file
out = {}
for arch in KIND_RULES["0.5.23"]:
    try:  # the class SGLang registers (its EntryClass's file, where two files define it)
        mod = importlib.import_module("sglang.srt.models." + entry_file(models, arch).stem)
        cls = getattr(mod, arch)
    except Exception:  # the CPU build cannot import it (qwen3_5*: a GPU kernel): its source
        out[arch] = {"from_file": True}
        continue
    got = {}
    for kind in ("eagle3", "dflash", "dspark"):
        fn = getattr(cls, f"set_{kind}_layers_to_capture", None)
        if fn is None:
            continue
        src, owner = inspect.getsource(fn), fn.__qualname__.split(".")[0]
        if "language_model.set_" in src:  # delegates: read the language model's
            owner += " -> delegates"
        shift = "first_id_1" if "[0] == 1" in src else "plus1" if "+ 1 for" in src else "none"
        got[kind] = [owner, shift]
    out[arch] = got
print("MODELS" + str(models))
print("JSON" + json.dumps(out))
"""
    from setters import read_setters

    p = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=280, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.split("JSON", 1)[1])
    models = Path(p.stdout.split("MODELS", 1)[1].split("\n", 1)[0].strip())
    for arch in got:  # a module the CPU build cannot import: its source, read as 0.5.17's is
        if got[arch].get("from_file"):
            got[arch] = {"from_file": True, **read_setters(models, arch)}
    for arch, rules in KIND_RULES[V23].items():
        if got[arch].pop("from_file", False):  # only Qwen3.5's modules do not import
            assert arch.startswith("Qwen3_5"), arch
        assert "dspark" not in got[arch], arch
        for kind in ("eagle3", "dflash"):
            rule = rules.get(kind)
            if rule is None:
                assert kind not in got[arch], (arch, kind)
                continue
            owner, shift = got[arch][kind]
            assert rule.setter.split(".")[0] == owner.split(" ")[0], (arch, kind, owner)
            if owner.endswith("delegates"):  # Kimi-K2.5 -> its DeepseekV3ForCausalLM
                assert rule.shift == KIND_RULES[V23]["DeepseekV3ForCausalLM"][kind].shift
            else:
                assert rule.shift == shift, (arch, kind, shift)
        if "dflash" in rules:
            assert rules["dspark"].setter == rules["dflash"].setter and "dspark" in rules


@pytest.mark.timeout(600)
def test_recorded_setters_are_sglang_0517s():
    """KIND_RULES for SGLang 0.5.17 (the GPU host image's torch takes it) against 0.5.17's own
    model sources, read from its PyPI wheel (it cannot be imported beside 0.5.23): every class
    verified on 0.5.17 has the rules of the setters 0.5.17 gives it, and no others (a class
    with a DFlash setter has DFlash and DSpark rules; DSPARK goes to that setter, since none of
    them has a DSpark hook, and SGLang's configure_aux_hidden_state_capture routes it so)."""
    from setters import classes, read_setters

    root = Path(_peer_root("HSDUMP_SGLANG0517_SRC")) / "sglang" / "srt"
    models = root / "models"
    route = root / "model_executor" / "model_runner_components" / "attention_backend_setup.py"
    text = route.read_text()
    assert 'hasattr(model, "set_dspark_layers_to_capture")' in text
    assert "model.set_dflash_layers_to_capture(dflash_target_layer_ids)" in text
    by_name = classes(models)
    verified = [a for f in FAMILIES if f.verified_on(V17) for a in f.architectures]
    rules17 = KIND_RULES[V17]
    assert set(rules17) <= set(verified)
    for arch in verified:
        got = read_setters(models, arch, by_name)
        assert "dspark" not in got, arch
        delegated = got.get("eagle3", [""])[0].endswith("delegates")
        if arch not in rules17:  # no rule: no DFlash setter (a delegating wrapper is left out)
            assert "dflash" not in got or delegated, (arch, got)
            continue
        for kind in ("eagle3", "dflash"):
            rule = rules17[arch].get(kind)
            assert (rule is None) == (kind not in got), (arch, kind, got)
            if rule is None:
                continue
            owner, shift = got[kind]
            assert rule.setter.split(".")[0] == owner.split(" ")[0], (arch, kind, owner)
            if owner.endswith("delegates"):  # Kimi-K2.5 -> its DeepseekV3ForCausalLM
                assert rule.shift == rules17["DeepseekV3ForCausalLM"][kind].shift
            else:
                assert rule.shift == shift, (arch, kind, shift)
        if "dflash" in rules17[arch]:
            assert rules17[arch]["dspark"].setter == rules17[arch]["dflash"].setter
    # the DFlash family on 0.5.17 and 0.5.23 alike for the class the GPU path serves
    for kind in ("dflash", "dspark", "eagle3"):
        assert kind_rule("LlamaForCausalLM", kind, "0.5.17") == IdRule(
            KIND_RULES[V23]["LlamaForCausalLM"][kind].setter,
            KIND_RULES[V23]["LlamaForCausalLM"][kind].shift,
            rules17["LlamaForCausalLM"][kind].where,
        )
    check_kinds("LlamaForCausalLM", ["eagle3", "dflash", "dspark"], False, "0.5.17")
    with pytest.raises(ValueError, match="Checked for dflash: .*LlamaForCausalLM"):
        check_kinds("Qwen3_5ForCausalLM", ["dflash"], False, "0.5.17")


@pytest.mark.gpu
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "family, kind, layers",
    [
        # DeepSeek-V3: DFlash ids shift by 1, EAGLE-3 ids only when the first is 1
        ("deepseek_v3", "dflash", [2, 3, 5]),
        ("deepseek_v3", "eagle3", [3, 4, 5]),
        # Qwen3.5's text class (qwen3_5_text.py; its module does not import on the CPU)
        ("qwen3_5", "dflash", [2, 3, 5]),
    ],
)
def test_gpu_classes_serve_the_kind_from_the_layers_hsdump_names(family, kind, layers, tmp_path):
    """The rules read from SGLang's code for classes its CPU engine cannot run, on one GPU (not
    run yet: KIND_RULES still marks them a code reading). MoE rows: the layer hsdump names must
    be the closest of it and its neighbours (near-tied routing flips experts in bf16)."""
    import torch
    from families import FAMILIES, build
    from families import hf_hidden_states as reference

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fam = FAMILIES[family]
    ckpt = build(family)
    ids = K.serving_ids(kind_rule(fam.cls, kind, V23), layers)
    assert ids is not None
    got = probe(ckpt, kind, ids, tmp_path, device="cuda")
    for j in range(2):
        prompt = got[f"ids/{j}"].tolist()
        ref = reference(ckpt, fam.cls, [prompt], None, "cuda")[0]
        rows = got[f"rows/{j}"]
        H = ref[0].shape[-1]
        for b, k in enumerate(layers):
            block = rows[:, b * H : (b + 1) * H]
            errs = {d: rel_err(block, ref[k + d]) for d in (-1, 0, 1) if 0 <= k + d < len(ref)}
            assert min(errs, key=errs.get) == 0 and errs[0] < 0.1, (k, errs)
