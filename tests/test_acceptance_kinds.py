"""bench/acceptance_kinds.py's drafters reach SGLang the way SpecForge trains them (issue 43).

`bench/acceptance_kinds.py contract` (run as a script: tests import nothing of bench/) builds,
for each kind on hsdump's tiny Llama, the drafter's config with the serving ids hsdump records,
SpecForge 0.2.0's own draft model from it, a checkpoint in its trainer's layout and its own
export (`export_to_sglang` for EAGLE-3, `export_to_hf` for DFlash and DSpark), then loads each
folder into SGLang 0.5.23's own class for its architecture on the CPU and records every
parameter its load_weights fills. What this pins: every parameter of SGLang's DFlashDraftModel,
DSparkDraftModel and LlamaForCausalLMEagle3 is filled from SpecForge's export (SGLang skips a
name it does not know and keeps that parameter's initial values, silently), the layer ids
SGLang reads are the serving ids, the mask token is set, and SGLang refuses a DSpark config that
carries its Markov head's fields only under dflash_config (SpecForge's recipe layout), which is
why the driver writes them at the top level too. SpecForge's trainer itself runs on the GPU
host (its EAGLE-3 loss is a Triton kernel); the DFlash/DSpark trainer on the CPU is the by-hand
rehearsal in docs/trainers.md.
"""

import json
import os
import subprocess
import sys

import pytest
from factories import ROOT
from test_export import _peer_root


# the engine tier: SGLang's own drafter classes build and load the exports (SGLang decides)
@pytest.mark.engine
def test_specforge_exports_load_in_sglangs_drafter_classes(tmp_path):
    sf = _peer_root("HSDUMP_SPECFORGE_SRC")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([sf, os.environ.get("PYTHONPATH", "")]))
    env["HSDUMP_CACHE"] = os.environ.get("HSDUMP_CACHE", str(tmp_path / "cache"))
    p = subprocess.run(
        [sys.executable, "bench/acceptance_kinds.py", "contract", "--target", "tiny:llama",
         "--out", str(tmp_path / "c")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert p.returncode in (0, 1), p.stderr[-3000:]
    start = p.stdout.index("{\n")
    r = json.loads(p.stdout[start:])
    assert set(r) == {"dflash", "eagle3", "dspark", "dspark-nested"}, r
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
    assert p.returncode == 0, p.stdout[-2000:]
