"""bench/online_pair.py: issue 73's results JSON from the online bench and the two drafters'
serve JSONs: the online minus offline accept length, paired over the prompts both served."""

import json
import subprocess
import sys

from factories import ROOT


def _serve(per_prompt: dict) -> dict:
    tok = sum(t for t, _ in per_prompt.values())
    ver = sum(v for _, v in per_prompt.values())
    return dict(batched=dict(accept_length=round(tok / ver, 4)), per_prompt=per_prompt)


def _run(tmp_path, online: dict, offline: dict):
    bench = dict(consumer="specforge", kind="eagle3", cap_bytes=100, peak_bytes=90,
                 bytes_published=900, epochs=2, samples_published=8, samples_consumed=8,
                 kills=dict(samples_lost=0), unrelated="dropped")  # fmt: skip
    paths = {}
    for name, doc in (("bench", bench), ("online", _serve(online)), ("offline", _serve(offline))):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    out = tmp_path / "res.json"
    p = subprocess.run([sys.executable, "bench/online_pair.py", "--bench", paths["bench"],
                        "--online", paths["online"], "--offline", paths["offline"],
                        "--out", out, "--min-prompts", "4"],
                       cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(out.read_text())


def test_level_drafters_pair_to_zero_and_a_better_one_does_not(tmp_path):
    same = {f"p{i}": [100, 40 + i] for i in range(6)}
    r = _run(tmp_path, same, same)
    m = r["online_minus_offline"]
    assert (m["mean"], m["ci95"], m["prompts"]) == (0.0, [0.0, 0.0], 6) and r["level"]
    assert r["kills"] == {"samples_lost": 0} and "unrelated" not in r
    assert r["cap_bytes"] == 100 and r["bytes_published"] == 900
    # the online drafter accepts more on every prompt (fewer verify steps for the same tokens);
    # a prompt only one of them served is left out
    better = {k: [t, v - 5] for k, (t, v) in same.items()}
    r = _run(tmp_path, {**better, "extra": [10, 5]}, same)
    m = r["online_minus_offline"]
    assert m["prompts"] == 6 and m["mean"] > 0 and m["ci95"][0] > 0 and not r["level"]
    assert m["prompts_online_higher"] == 6 and m["prompts_online_lower"] == 0
    want = 600 / sum(v for _, v in better.values()) - 600 / sum(v for _, v in same.values())
    assert abs(m["mean"] - want) < 1e-4
