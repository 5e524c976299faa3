"""The SpecForge recipes' CPU sections, run as written (docs/train-eagle3.md, train-dflash.md,
train-dspark.md).

Each page marks its CPU code blocks with `<!-- recipe-cpu -->` (or `<!-- recipe-cpu: shared -->`
for the SpecForge install and the one `capture=all_kinds` capture that feeds all three) on the
line before a ```bash fence. The blocks run with bash in a temporary folder that stands for the
checkout's root (`bench` linked there, `.venv/bin` first on PATH, HSDUMP_CACHE and HF_HOME
inherited): the shared blocks once (identical on the three pages), then each page's own blocks in
order in one bash process, every command checked (`set -e`). Each trainer must have written its
checkpoint and SpecForge's export its folder; the pages' `check-served` step loads that folder
into SGLang 0.5.23's drafter class. SGLang 0.5.23's CPU engine does not serve these drafters; the
last tests check that it still refuses, as the pages say.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from factories import ROOT

PAGES = {k: ROOT / "docs" / f"train-{k}.md" for k in ("eagle3", "dflash", "dspark")}
MARK = re.compile(r"^<!-- recipe-cpu(: shared)? -->\n```bash\n(.*?)^```$", re.M | re.S)


def blocks(page: Path) -> list:
    """The page's marked CPU blocks in order: (shared, code)."""
    return [(bool(m.group(1)), m.group(2)) for m in MARK.finditer(page.read_text())]


def bash(work: Path, code: str, timeout: int) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    for k in ("PYTHONPATH", "SPECFORGE_DEVICE", "TORCHDYNAMO_DISABLE", "HSDUMP_FORBID_ENGINE"):
        env.pop(k, None)
    script = "set -euo pipefail\n" + code
    return subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def check(p: subprocess.CompletedProcess, what: str) -> None:
    assert p.returncode == 0, f"{what}: exit {p.returncode}\n{(p.stdout + p.stderr)[-4000:]}"


def test_pages_mark_their_cpu_blocks():
    """Every page has the shared blocks, identical on all three, then its own blocks."""
    shared = {k: [c for s, c in blocks(p) if s] for k, p in PAGES.items()}
    assert shared["eagle3"], "no `<!-- recipe-cpu: shared -->` block in train-eagle3.md"
    assert shared["eagle3"] == shared["dflash"] == shared["dspark"]
    for k, p in PAGES.items():
        own = [c for s, c in blocks(p) if not s]
        assert len(own) >= 3, f"{p.name}: {len(own)} recipe-cpu blocks"
        text = "".join(own)
        assert f"--kind {k}" in text and "specforge_cli" in text and "check-served" in text


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The temporary checkout root, after the shared blocks (the install and the capture)."""
    w = tmp_path_factory.mktemp("recipe")
    (w / "bench").symlink_to(ROOT / "bench")
    for shared, code in blocks(PAGES["eagle3"]):
        if not shared:
            continue
        p = bash(w, code, timeout=600)
        if p.returncode != 0 and not (w / ".specforge" / "specforge").is_dir():
            msg = f"cannot install SpecForge's wheel: {(p.stdout + p.stderr)[-600:]}"
            if os.environ.get("CI"):
                pytest.fail(msg)
            pytest.skip(msg)
        check(p, "the shared blocks")
    return w


DONE: dict = {}


def recipe(work: Path, kind: str) -> Path:
    """The page's own blocks, once per module; the drafter folder SpecForge exported."""
    if kind not in DONE:
        code = "\n".join(c for s, c in blocks(PAGES[kind]) if not s)
        p = bash(work, code, timeout=900)
        DONE[kind] = p
    check(DONE[kind], f"train-{kind}.md's CPU blocks")
    return work / "outputs" / "recipe" / "served" / kind


@pytest.mark.engine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["eagle3", "dflash", "dspark"])
def test_recipe_runs_as_written(work, kind):
    served = recipe(work, kind)
    ckpt = work / "outputs" / "recipe" / "train" / kind / f"{kind}-step2"
    assert (ckpt / "training_state.pt").is_file(), f"no checkpoint at {ckpt}"
    assert (served / "config.json").is_file() and (served / "model.safetensors").is_file()
    log = DONE[kind].stdout + DONE[kind].stderr
    assert "step 2: {" in log, "SpecForge logged no step 2"
    assert '"gaps": []' in log, "check-served found gaps"


SERVE = r"""
import sys
from hsdump.capture.patch import prepare_process


def engine(alg, target, drafter):
    from sglang.srt.entrypoints.engine import Engine

    kw = dict(model_path=target, device="cpu", attention_backend="torch_native",
              disable_cuda_graph=True, skip_tokenizer_init=True, sampling_backend="pytorch",
              disable_radix_cache=True, mem_fraction_static=0.5, max_total_tokens=4096,
              speculative_algorithm=alg, speculative_draft_model_path=drafter)
    if alg == "EAGLE3":
        kw.update(speculative_num_steps=3, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=4)
    eng = Engine(**kw)
    out = eng.generate(input_ids=[[0, 5, 6, 7]],
                       sampling_params={"temperature": 0, "max_new_tokens": 4})
    print("SERVED", alg, out, flush=True)
    eng.shutdown()


def main():
    prepare_process("cpu")
    target = sys.argv[1]
    for alg, drafter in zip(sys.argv[2::2], sys.argv[3::2]):
        try:  # EAGLE3 last: a scheduler that dies takes this process with it
            engine(alg, target, drafter)
        except Exception as e:
            print("REFUSED", alg, type(e).__name__, e, flush=True)


if __name__ == "__main__":
    main()
"""

REFUSED = {
    "dflash": "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'",
    "dspark": "DSpark speculative decoding only supports CUDA, NPU or XPU device",
    "eagle3": "object has no attribute 'copy_all_layer_kv_cache_cpu'",
}


@pytest.mark.engine
@pytest.mark.timeout(400)
def test_cpu_engine_does_not_serve_these_drafters(work, tmp_path):
    """What the pages say of serving on the CPU: SGLang 0.5.23's CPU engine refuses DFlash and
    DSpark before it starts, and EAGLE-3's engine dies building its KV pool, each on the
    recipe's own exported folder. When this fails because SGLang served, the pages' CPU
    sections should serve too."""
    args = []
    for kind in ("dflash", "dspark", "eagle3"):
        args += [kind.upper(), str(recipe(work, kind))]
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    target = work / "outputs" / "recipe" / "target"
    try:
        p = subprocess.run([sys.executable, str(script), str(target), *args],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
        out = p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:  # a scheduler that died can leave the parent waiting
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
            errors="replace"
        )
    assert "SERVED" not in out, "SGLang's CPU engine served: the pages' CPU sections can serve"
    for kind, msg in REFUSED.items():
        assert msg in out, f"{kind}: {msg!r} not in the engine's output\n{out[-3000:]}"


# The checked-in run configs (docs/configs/): the run's `bench.acceptance train` flags and its
# training records, as each config's header says; `run_config` rebuilds each from them.
CONFIGS = {
    "eagle3": (2498, dict(epochs=5, attention_backend="sdpa", learning_rate=1e-3, ttt_length=3)),
    "dspark": (3298, dict(epochs=2, attention_backend="flex_attention")),
    "dflash": (2098, dict(epochs=5, attention_backend="flex_attention")),
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_checked_in_config_is_what_train_writes(kind, tmp_path, monkeypatch):
    import argparse

    import yaml

    import bench.acceptance.specforge as sf

    text = (ROOT / "docs" / "configs" / f"{kind}-smollm2.yaml").read_text()
    n_train, flags = CONFIGS[kind]
    for k, v in flags.items():
        assert f"--{k.replace('_', '-')} {v}".replace("0.001", "1e-3") in text
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": true}')  # SmolLM2's
    monkeypatch.setattr(sf, "trainer_target", lambda target, dest: "outputs/smollm2/target")
    a = argparse.Namespace(kind=kind, target=str(tmp_path), batch_size=8, max_length=1024,
                           num_workers=8, save_interval=0, log_interval=20, max_steps=None,
                           learning_rate=None, ttt_length=None, cpu=False, dtype=None,
                           profile_at=0, draft_config="d.json", **{k: v for k, v in flags.items()
                           if k not in ("learning_rate", "ttt_length")})  # fmt: skip
    a.learning_rate, a.ttt_length = flags.get("learning_rate"), flags.get("ttt_length")
    out = Path("outputs/smollm2/train") / kind
    want = sf.run_config(a, kind, out / "records/train", out / "records/eval", n_train, out)
    got = yaml.safe_load(text)
    assert got["model"].pop("draft_model_config") == f"outputs/smollm2/draft/{kind}.json"
    want["model"].pop("draft_model_config")
    if kind == "eagle3":  # the warm start `--head-init target-frozen` adds
        head = "outputs/smollm2/train/eagle3/head-init"
        assert got["model"].pop("draft_checkpoint_path") == head
        assert got["model"].pop("vocab_mapping_path") == head + "/vocab_mapping.pt"
    assert got == json.loads(json.dumps(want))


ONLINE = ROOT / "docs" / "online.md"


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_online_recipe_runs_as_written(work):
    """docs/online.md's CPU section as written, after the DFlash page's (its target and drafter
    config): SGLang's CPU engine captures 2 epochs into the folder, one engine for both, under
    the page's cap, sampled here every 5 ms while it runs, beside SpecForge's own online
    trainer with the checked-in config; every published sample is acknowledged once, nothing
    is left, and the trainer kept its newest two checkpoints."""
    import sqlite3
    import threading

    from hsdump.online import folder as F

    recipe(work, "dflash")
    if not (work / "docs").exists():
        (work / "docs").symlink_to(ROOT / "docs")
    (code,) = [c for _, c in blocks(ONLINE)]
    cap = int(re.search(r"online.cap_bytes=(\d+)", code).group(1))
    folder = work / "outputs" / "online"
    peak, halt = [0], threading.Event()

    def sample():
        while not halt.wait(0.005):
            peak[0] = max(peak[0], F.shard_bytes(folder / F.STORE))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        p = bash(work, code, timeout=800)
    finally:
        halt.set()
        t.join()
    check(p, "online.md's CPU block")
    summary = json.loads((work / "outputs" / "online-capture.log").read_text().splitlines()[-1])
    plan = json.loads((folder / F.PLAN).read_text())
    n = plan["samples_per_epoch"]
    assert summary["engine_starts"] == 1 and len(summary["epochs"]) == 2, summary
    assert summary["samples_published"] == 2 * n and summary["dropped_at_end"] == 0, summary
    with sqlite3.connect(folder / "control" / "consumer.sqlite") as db:
        acked = db.execute("SELECT count(*) FROM acked").fetchone()[0]
    assert acked == 2 * n
    assert 0 < peak[0] <= cap, (peak[0], cap)
    assert summary["gate_wait_s"] > 0, "the cap never held the capture back: lower it"
    assert F.shard_bytes(folder / F.STORE) == 0
    assert F.side(folder, F.DONE) is not None and F.side(folder, F.CONSUMER_FAILED) is None
    lines, _ = F.read_lines(folder / F.ACKS)
    assert len(lines) == len(set(lines)) == 2 * n
    kept = sorted(d.name for d in (work / "outputs" / "online" / "run").glob("dflash-step*"))
    assert kept == [f"dflash-step{2 * n - 1}", f"dflash-step{2 * n}"], kept
