"""Sixteen writer processes commit into one dataset folder at once; two are killed in the
middle of a commit (one after its shard's rename, one half-way through its commit record) and
re-run alone. The dataset ends with every sample exactly once and verifies clean."""

import signal
import sys

import harness
from factories import ROOT

from hsdump.dist import writer_tag
from hsdump.store import commits
from hsdump.store.reader import HsdumpDataset
from hsdump.tools.verify import UNLISTED, verify

JOBS, SAMPLES = 16, 16 * 12  # 12 samples per job, 5 per shard: 3 shards each
FAULTS = {3: "before_record@2", 11: "mid_record@2"}


def start(out, job, fault=None):
    """Job `job`'s writer (`bench/scale.py worker`), running; through tests/harness.py, so it is
    forked from the harness's fork server (torch and hsdump's store already imported)."""
    cmd = [sys.executable, ROOT / "bench" / "scale.py", "worker", out, JOBS, job, SAMPLES]
    return harness.run_python_script(
        [str(c) for c in cmd],
        cwd=ROOT,
        env=harness.clean_env(fault=fault),
        timeout=600,
        wait=False,
    )


def test_sixteen_writers_at_once_two_killed_and_rerun(tmp_path):
    out = tmp_path / "ds"
    procs = {j: start(out, j, FAULTS.get(j)) for j in range(JOBS)}
    logs = {j: p.communicate(timeout=600)[0] for j, p in procs.items()}
    for j, p in procs.items():
        want = -signal.SIGKILL if j in FAULTS else 0
        assert p.returncode == want, (j, logs[j][-2000:])

    # meanwhile: a valid dataset of what the jobs committed, each job only its own ids
    c = commits.load(out)
    assert not c.problems, c.problems
    for sid, shard in c.samples.items():
        assert shard.startswith(f"shards/{writer_tag(JOBS, sid % JOBS)}/")
    assert len(HsdumpDataset(str(out))) == len(c.samples) < SAMPLES
    torn = out / "commits" / f"{writer_tag(JOBS, 11)}.jsonl"
    assert torn.read_bytes()[-1:] != b"\n" and c.torn == {
        writer_tag(JOBS, 11): c.torn[writer_tag(JOBS, 11)]
    }
    # job 3's shard that reached the fault second (writer threads finish out of order):
    # renamed, never recorded; its other thread may have renamed one more meanwhile
    on_disk = {
        str(p.relative_to(out))
        for p in (out / "shards" / writer_tag(JOBS, 3)).rglob("*.safetensors")
    }
    orphans = on_disk - set(c.shards)
    assert 1 <= len(orphans) <= 2, orphans
    stamps = {n: (out / n).stat().st_mtime_ns for n in c.shards}

    # the two killed jobs, re-run (at once): they resume
    again = {j: start(out, j) for j in FAULTS}
    for j, p in again.items():
        text = p.communicate(timeout=600)[0]
        assert p.returncode == 0, (j, text[-2000:])

    c = commits.load(out)
    assert not c.problems, c.problems
    assert sorted(c.samples) == list(range(SAMPLES))  # every sample ...
    assert sum(len(m["ids"]) for m in c.shards.values()) == SAMPLES  # ... exactly once
    assert all((out / n).stat().st_mtime_ns == t for n, t in stamps.items())  # none rewritten
    assert torn.read_bytes()[-1:] == b"\n"  # the torn record was cut on resume
    ds = HsdumpDataset(str(out))
    assert ds.ids == list(range(SAMPLES)) and ds.lengths == [16] * SAMPLES
    r = verify(str(out))
    assert r.ok, r.lines()[:10]
    assert r.samples_ok == SAMPLES
    # what the killed jobs left behind (a shard renamed but never recorded, unless the re-run
    # reused its name; a temporary file another writer thread had open) is unlisted garbage
    # that verify names as info, under the killed jobs' folders only
    garbage = {p.where for p in r.info if p.what == UNLISTED}
    killed = tuple(f"shards/{writer_tag(JOBS, j)}/" for j in FAULTS)
    assert all(g.startswith(killed) for g in garbage), garbage
    assert all((o in c.shards) != (o in garbage) for o in orphans)
