"""hsdump's capture list is the last word, whatever a family's setter does after the load.

SGLang 0.5.23 calls the model's `set_eagle3_layers_to_capture` a second time, from
`ModelRunner.init_attention_backends`, and each family maps the ids by its own rule:
DeepSeek-V2/V3's (Kimi-K2.5's text model) adds 1 only when the first id is 1, so hsdump's
[3, 31, 59] would become [2, 30, 58] (measured on the GPU: docs/performance.md, "Fidelity on the
GPU"). MLA does not run on SGLang's CPU engine, so tests/layer_override_check.py
gives the tiny Llama's setter DeepSeek's rule inside the real scheduler process, captures
[1, 3, 4] through CaptureEngine and says which transformers float32 hidden_states[i] each
stored layer is. Real engine: the second setter call and its timing are SGLang's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.engine
def test_capture_layers_survive_a_setter_that_remaps_them(tmp_path):
    out = tmp_path / "override.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "layer_override_check.py"), "--deepseek-rule"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    # SGLang did call the setter again and DeepSeek's rule did shift the list: without hsdump
    # setting its own again, the rows would be hidden_states[0, 2, 3]
    after = [c for c in res["calls"] if c["event"] == "after_init_attention_backends"]
    assert after and after[0]["layers_to_capture"] == [0, 2, 3], res["calls"]
    for k, r in res["layers"].items():
        assert r["best_hf_index"] == int(k), res["layers"]
        assert r["err_at_k"] < 0.02, res["layers"]
    assert p.returncode == 0 and "layers right" in p.stdout
