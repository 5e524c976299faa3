"""bench/repetition.py: a served drafter's accept length by its outputs' repetition, and the
repetition along the answer (run as a script: tests import nothing of bench/)."""

import gzip
import json
import subprocess
import sys

from factories import ROOT


def _run(res, *args):
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "repetition.py"), "--results", str(res), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return p


def _answers() -> dict:
    """Eight answers of 16 tokens: p0-p3 without a loop, p4-p7 in a loop of period 2 after 4."""
    flat = [list(range(100 * i, 100 * i + 16)) for i in range(4)]
    loop = [[7, 8, 9, 10] + [5, 6] * 6 for _ in range(4)]
    return {f"p{i}": o for i, o in enumerate(flat + loop)}


def test_quarters_and_windows(tmp_path):
    """Eight prompts: four answer without a loop (16 distinct tokens), four fall into a loop of
    period 2 after 4 tokens. With n = 2 a token repeats once the 3 tokens ending at it came
    before: in the looping answers tokens 9-16 (8 of 16: the loop's first trigram comes back
    at token 9), in the others none. The drafter accepts 30 tokens in 10 verify steps on the
    loops and 12 in 10 elsewhere: its two least repetitive quarters are 1.2, the other two
    3.0. Along the answer (windows of 8 positions): none repeated in 1-8, half the cells in
    9-16 (all of the looping half's)."""
    res = tmp_path / "res"
    res.mkdir()
    outs = _answers()
    per = {f"p{i}": [12, 10] if i < 4 else [30, 10] for i in range(8)}
    plain = dict(engine={"speculative_algorithm": None}, outputs=outs,
                 per_prompt={k: [16, 0] for k in outs})  # fmt: skip
    drafter = dict(engine={"speculative_algorithm": "EAGLE3"}, outputs=outs, per_prompt=per)
    (res / "serve-plain.json").write_text(json.dumps(plain))
    (res / "serve-eagle3-default.json.gz").write_bytes(gzip.compress(json.dumps(drafter).encode()))
    p = _run(res, "--n", "2", "--window", "8", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    qs = r["drafters"]["eagle3-default"]
    assert [q["prompts"] for q in qs] == [2, 2, 2, 2]
    assert [q["repetition"] for q in qs] == [0.0, 0.0, 0.5, 0.5]
    assert [q["accept_length"] for q in qs] == [1.2, 1.2, 3.0, 3.0]
    assert r["windows"] == [{"positions": "1-8", "repetition": 0.0},
                            {"positions": "9-16", "repetition": 0.5}]  # fmt: skip
    assert "plain" not in r["drafters"]
    assert "eagle3-default: prompts by repetition" in p.stdout and "0.500 -> 3.000" in p.stdout
    assert all("step_acceptance" not in q for q in qs)  # no histograms reported: none made up


def test_step_acceptance_by_quarter(tmp_path):
    """With SGLang's per-request histograms (verify steps by drafts accepted, 3 drafts a step),
    each quarter's share per draft step of the verify steps that reached it and accepted it.
    The flat answers' requests: 10 steps, 6 accepting none, 4 one (step 1: 4/10, step 2: 0/4;
    step 3 reached by none: not given). The loops': 10 steps, 1 accepting none, 1 one, 2 two,
    6 all three (step 1: 9/10, step 2: 8/9, step 3: 6/8)."""
    res = tmp_path / "res"
    res.mkdir()
    outs = _answers()
    per = {f"p{i}": [14, 10] if i < 4 else [33, 10] for i in range(8)}
    hist = {f"p{i}": [6, 4, 0, 0] if i < 4 else [1, 1, 2, 6] for i in range(8)}
    drafter = dict(engine={"speculative_algorithm": "EAGLE3"}, outputs=outs, per_prompt=per,
                   per_prompt_drafts=hist)  # fmt: skip
    (res / "serve-eagle3-default.json").write_text(json.dumps(drafter))
    p = _run(res, "--n", "2", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    qs = json.loads((tmp_path / "r.json").read_text())["drafters"]["eagle3-default"]
    assert [q["accept_length"] for q in qs] == [1.4, 1.4, 3.3, 3.3]
    assert [q["step_acceptance"] for q in qs] == [[0.4, 0.0]] * 2 + [[0.9, 0.8889, 0.75]] * 2
    assert "0.400/0.000" in p.stdout and "0.900/0.889/0.750" in p.stdout


def test_a_folder_without_serve_runs_is_refused(tmp_path):
    p = _run(tmp_path)
    assert p.returncode != 0 and "no serve-*.json" in p.stderr
