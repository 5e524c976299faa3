"""The tests' fork server (tests/zygote.py) runs an engine run as a fresh interpreter would."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import harness
import pytest

# what a run imports before its engine (the server's `preload`: torch, transformers, Hydra,
# hsdump, the default tokenizer), then, for an engine's run, SGLang's engine; the environment
# they leave
PROBE = textwrap.dedent(
    f"""
    import json, os, sys
    had = "sglang.srt.entrypoints.engine" in sys.modules
    sys.path.insert(0, {str(Path(harness.__file__).parent)!r})
    import zygote
    zygote.preload()
    if sys.argv[1:] == ["engine"]:
        import sglang.srt.entrypoints.engine
        import sglang.srt.models.registry
    print("PROBE " + json.dumps({{"had": had, "env": dict(os.environ)}}))
    """
)


def probe(out: str) -> dict:
    line = next(x for x in out.splitlines()[::-1] if x.startswith("PROBE "))
    return json.loads(line[len("PROBE ") :])


@pytest.mark.engine  # imports SGLang's engine module (no engine starts)
def test_a_forked_run_has_the_environment_a_fresh_one_has(tmp_path):
    if harness.fork_server() is None:
        pytest.skip(f"{harness.FORK_ENV}=0: no fork server")
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = harness.clean_env()
    kw = dict(cwd=tmp_path, env=env, timeout=300, wait=True)

    def fresh(*args):
        cmd = [sys.executable, str(script), *args]
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return probe(p.stdout)

    def forked(*args, engine=False):
        cmd = [sys.executable, str(script), *args]
        rc, out = harness.run_python_script(cmd, **kw, engine=engine)
        assert rc == 0, out[-3000:]
        return probe(out)

    # an engine's run: the server had imported SGLang's engine, a fresh interpreter had not, and
    # every variable the imports set (TORCHINDUCTOR_CACHE_DIR, CUDA_CACHE_PATH, ...) is as there
    got, want = forked("engine", engine=True), fresh("engine")
    assert got["had"] and not want["had"]
    assert got["env"] == want["env"]
    # a run that starts no engine, forked after that: the engine's variables are not its own
    got, want = forked(), fresh()
    assert got["env"] == want["env"]
    assert "CUDA_CACHE_PATH" not in want["env"] or "CUDA_CACHE_PATH" in env
