"""The family gate (hsdump.capture.families): a class is captured only on the SGLang releases
its rows were checked on against transformers; no engine, no SGLang import."""

import json
import os
import sys

import pytest

from hsdump.capture import families
from hsdump.capture.families import FAMILIES, check_verified, family_of, release


def test_release_part_of_a_version():
    assert release("0.5.23") == "0.5.23"
    assert release("0.5.23.post1") == "0.5.23"
    assert release("0.5.23rc0") == "0.5.23"
    assert release("0.5") == "0.5"
    assert release(None) is None and release("") is None


def test_every_family_names_where_and_on_which_version():
    seen = set()
    for fam in FAMILIES:
        assert fam.runs, fam.name
        assert len(set(fam.versions)) == len(fam.versions), fam.name
        for v, where in fam.runs:
            assert release(v) == v and where, (fam.name, v, where)
            assert fam.verified_on(v) == where
        assert not seen & set(fam.architectures), fam.name
        seen |= set(fam.architectures)
    assert len(seen) >= 20


def test_gate_accepts_a_class_on_its_verified_versions_only():
    llama = family_of("LlamaForCausalLM")
    assert set(llama.versions) >= {"0.5.23", "0.5.17"}
    for v in llama.versions:
        assert check_verified("LlamaForCausalLM", False, v) is llama
        assert check_verified("LlamaForCausalLM", False, v + ".post1") is llama
    # Kimi-K2.5: GPU checks on 0.5.17 and (bf16 and INT4 runs) on 0.5.23; refused on a release
    # between them that no check ran on, with the verified versions and the way to allow it named
    kimi = family_of("KimiK25ForConditionalGeneration")
    assert set(kimi.versions) == {"0.5.23", "0.5.17"}
    for v in kimi.versions:
        assert check_verified("KimiK25ForConditionalGeneration", False, v) is kimi
    with pytest.raises(ValueError) as e:
        check_verified("KimiK25ForConditionalGeneration", False, "0.5.20")
    msg = str(e.value)
    assert "KimiK25ForConditionalGeneration (Kimi-K2.5)" in msg
    assert "SGLang 0.5.23, 0.5.17 only" in msg
    assert "installed SGLang 0.5.20" in msg and "capture.allow_unverified=true" in msg
    with pytest.raises(ValueError, match=r"on SGLang 0\.5\.23, 0\.5\.17 only, not on the "):
        check_verified("LlamaForCausalLM", False, "0.5.20")
    # allowed: captured, but the manifest records no verified family
    assert check_verified("KimiK25ForConditionalGeneration", True, "0.5.20") is None
    # no SGLang runs (engine=dry): the class alone is checked
    assert check_verified("KimiK25ForConditionalGeneration", False, None) is kimi


def test_gate_refuses_an_unknown_class_on_any_version():
    for v in ("0.5.23", "0.5.17", None):
        with pytest.raises(ValueError, match="CohereForCausalLM: hsdump has not verified"):
            check_verified("CohereForCausalLM", False, v)
        assert check_verified("CohereForCausalLM", True, v) is None


def test_gate_reads_the_installed_version_without_importing_sglang(monkeypatch):
    from importlib import metadata

    def fake(name):
        assert name == "sglang"
        return "0.5.20"

    monkeypatch.setattr(families.metadata, "version", fake)
    assert families.installed_sglang() == "0.5.20"
    with pytest.raises(ValueError, match="installed SGLang 0.5.20"):
        check_verified("LlamaForCausalLM", False)

    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(families.metadata, "version", absent)
    assert families.installed_sglang() is None
    assert check_verified("LlamaForCausalLM", False) is family_of("LlamaForCausalLM")
    # the gate module itself never imports sglang
    code = (
        "import sys; import hsdump.capture.families as f; f.check_verified('LlamaForCausalLM', "
        "False); print(any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_verified_string_names_every_version():
    gemma = family_of("Gemma3ForCausalLM")
    s = gemma.verified
    assert "(SGLang 0.5.23)" in s and "(SGLang 0.5.17)" in s
    json.dumps(s)  # the manifest's `verified` stays a string


def test_extract_refuses_a_class_verified_on_another_sglang_version(tmp_path, tiny_llama):
    # extract.py on a checkpoint whose class hsdump verified, but not on the installed SGLang (a
    # user who upgraded to a release no check ran on; simulated by a sitecustomize that makes
    # importlib.metadata report SGLang 0.5.99): refused before the engine, naming the verified
    # versions and the way to allow it, with nothing written
    import harness

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "from importlib import metadata\n"
        "_version = metadata.version\n"
        "metadata.version = lambda name: '0.5.99' if name == 'sglang' else _version(name)\n"
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    out = tmp_path / "ds"
    rc, text = harness.extract(
        f"model.path={tiny_llama}",
        "dataset.max_samples=2",
        "capture.layers=[1,2]",
        out=out,
        env={"PYTHONPATH": path},
        timeout=300,
    )
    fam = family_of("LlamaForCausalLM")
    assert rc != 0 and "LlamaForCausalLM (Llama)" in text, text[-2000:]
    assert f"on SGLang {', '.join(fam.versions)} only" in text
    assert "installed SGLang 0.5.99" in text
    assert "capture.allow_unverified=true" in text and "Traceback" not in text
    assert not (out / "manifest.json").exists()


def test_every_cpu_verified_class_has_a_passing_cpu_result():
    # a class the gate accepts on 0.5.23 "CPU, tests/test_families.py" has a checkpoint in
    # tests/families.py whose recorded CPU result (bench/families_probe.py) passed
    from factories import ROOT
    from families import FAMILIES as TEST_FAMILIES

    results = json.loads((ROOT / "bench" / "results" / "families-cpu.json").read_text())
    assert results["env"]["sglang"] == "0.5.23"
    ok = {
        TEST_FAMILIES[n].cls
        for n, r in results["results"].items()
        if r.get("status") == "ok" and n in TEST_FAMILIES
    }
    for fam in FAMILIES:
        if (fam.verified_on("0.5.23") or "").startswith((families.CPU_TEST, families.CPU_PROBE)):
            tested = [a for a in fam.architectures if a in ok]
            assert tested, (fam.name, "no passing CPU result in bench/results/families-cpu.json")
    # and no class the results file records as refused is accepted
    for arch in results.get("refused", {}):
        assert family_of(arch) is None or family_of(arch).verified_on("0.5.23") is None, arch


def test_every_gpu_probe_on_0523_has_a_passing_gpu_result():
    # a class the gate accepts on 0.5.23 by the GPU probe has a recorded probe run on SGLang
    # 0.5.23 that passed (the per-sample rule, or the MoE rule where the note says so), in
    # bench/results/families-gpu-0523.json; and no family that failed there is accepted on 0.5.23
    from factories import ROOT
    from families import FAMILIES as TEST_FAMILIES

    results = json.loads((ROOT / "bench" / "results" / "families-gpu-0523.json").read_text())
    assert results["env"]["sglang"] == "0.5.23" and "H200" in results["env"]["gpu"]
    passed, failed = set(), set()
    for n, r in results["results"].items():
        moe = r.get("status", "").startswith("wrong") and r.get("moe_rule_ok")
        (passed if r.get("status") == "ok" or moe else failed).add(TEST_FAMILIES[n].cls)
    probed = 0
    for fam in FAMILIES:
        where = fam.verified_on("0.5.23") or ""
        if where.startswith(families.GPU_PROBE):
            probed += 1
            ok = [a for a in fam.architectures if a in passed]
            assert ok, (fam.name, "no passing SGLang 0.5.23 GPU result")
            if "MoE rule" not in where:
                assert all(
                    results["results"][n]["status"] == "ok"
                    for n, f in TEST_FAMILIES.items()
                    if f.cls in ok and n in results["results"]
                ), fam.name
    assert probed >= 9
    for arch in failed:
        assert family_of(arch) is None or family_of(arch).verified_on("0.5.23") is None, arch


def test_final_norm_is_the_stack_norm_beside_other_direct_norms():
    # Gemma-4's text stack has a per-layer-input projection norm beside its final `norm`:
    # capture.final takes `norm`; two norms neither named so stay ambiguous
    import torch

    from hsdump.capture.patch import final_norm

    class RMSNorm(torch.nn.Module):
        pass

    stack = torch.nn.Module()
    stack.layers = torch.nn.ModuleList()
    stack.per_layer_projection_norm = RMSNorm()
    stack.norm = RMSNorm()
    assert final_norm(stack) is stack.norm
    other = torch.nn.Module()
    other.a_norm, other.b_norm = RMSNorm(), RMSNorm()
    with pytest.raises(RuntimeError, match="2 direct norm modules"):
        final_norm(other)
