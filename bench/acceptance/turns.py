"""Batch-1 timing in turns: engines that are all up (asleep when idle) take the GPU a few
prompts at a time, so that plain decoding and each drafter are timed over the same minutes.

On the H100 of 2026-12-07 a speculative round's cost drifted from 3.45 to 5.48 ms over one
engine's batch-1 timing while plain's step, timed minutes earlier, stayed at 2.1 ms: timed one
after another, the engines' order decided part of their ratio. In turns, a host that slows down
slows every engine alike, and each turn is a paired comparison of its own.

The protocol is files in one folder (the run's gate folder): the coordinator (run-all) writes
`turn-NAME-J`; the engine NAME serves its J-th group of prompts and writes `done-NAME-J`
holding `last` after its final group, `more` otherwise. The coordinator hands the turns round
robin, the order rotated each round so that no engine always goes first. Besides: the host's
CPU steal and the GPU's clock, read between groups (outside the timed calls)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hsdump.store.files import atomic_write


class Turns:
    """The engine's side: wait for its turn J, then say it is done."""

    def __init__(self, folder, name: str, poll_s: float = 0.02):
        self.folder, self.name, self.poll_s = Path(folder), name, poll_s
        self.session = None  # the coordinator's: which engines took turns together

    def wait(self, j: int) -> None:
        f = self.folder / f"turn-{self.name}-{j}"
        while not f.exists():
            time.sleep(self.poll_s)
        self.session = f.read_text().strip() or self.session

    def done(self, j: int, last: bool) -> None:
        atomic_write(self.folder / f"done-{self.name}-{j}", b"last\n" if last else b"more\n")


def hand_turns(folder, names, alive, poll_s: float = 0.02) -> list:
    """The coordinator's side: turn 0 to each engine in `names`, one at a time, then turn 1 in
    the order rotated by one, and so on, until each has said `last` (or its process is gone:
    `alive(name)` false with no done file). Returns the (turn, name) pairs in the order run."""
    folder = Path(folder)
    session = f"{time.time():.6f}-{os.getpid()}"  # the engines timed together share it
    active, order, j = list(names), [], 0
    while active:
        k = j % len(active)
        for name in active[k:] + active[:k]:
            atomic_write(folder / f"turn-{name}-{j}", f"{session}\n".encode())
            done = folder / f"done-{name}-{j}"
            while not done.exists() and alive(name):
                time.sleep(poll_s)
            if not done.exists():  # the engine died: the others go on
                active.remove(name)
                continue
            order.append((j, name))
            if done.read_text().strip() == "last":
                active.remove(name)
        j += 1
    return order


def _proc_stat() -> dict:
    """/proc/stat's CPU lines: {"cpu": [user .. steal], "cpu0": [...], ...} (jiffies); {}
    where unreadable."""
    out = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0].startswith("cpu"):
                    out[parts[0]] = [int(x) for x in parts[1:9]]
    except (OSError, ValueError):
        return {}
    return out


def cpu_times():
    """The host's CPU times from /proc/stat (user .. steal, jiffies); None where unreadable."""
    return _proc_stat().get("cpu")


def steal_share(before, after):
    """The share of the host's CPU time a hypervisor gave to others between two readings."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    return round(d[7] / total, 4) if total > 0 else None


def _stat(pid):
    """(parent pid, name, CPU ticks used, the CPU it last ran on) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()  # from field 3 (state) on
    return int(rest[1]), name, int(rest[11]) + int(rest[12]), int(rest[36])


def proc_cpu(root=None):
    """This process and its descendants (an engine's scheduler and detokenizer): {pid: [name,
    CPU ticks used, the CPU it last ran on]}; {} where /proc is unreadable. Read before and
    after a group, it says whether a speculative round waits on the CPU (its scheduler busy
    the whole group) and on which CPUs it ran."""
    root = os.getpid() if root is None else root
    stats = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            stats[pid] = _stat(pid)
        except (OSError, ValueError, IndexError):
            continue
    kids, todo = {}, [root]
    while todo:
        me = todo.pop()
        if me in stats and me not in kids:
            kids[me] = list(stats[me][1:])
            todo += [p for p, s in stats.items() if s[0] == me]
    return kids


def proc_cpu_share(before, after, wall_s):
    """Per process busy over a group: [name, CPU seconds / wall seconds, the CPU it ran on at
    the end], the busiest first; processes that used no CPU are left out."""
    if not before or not after or not wall_s:
        return []
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    rows = []
    for pid, (name, ticks, cpu) in after.items():
        used = ticks - before.get(pid, [name, 0, cpu])[1]  # one started since: all of it
        if used > 0:
            rows.append([name, round(used / hz / wall_s, 3), cpu])
    return sorted(rows, key=lambda r: -r[1])


def steal_by_cpu():
    """Each CPU's steal and total jiffies from /proc/stat: {cpu: [steal, total]}."""
    return {int(k[3:]): [v[7], sum(v)] for k, v in _proc_stat().items() if k != "cpu"}


def stolen_cpus(before, after, least: float = 0.01):
    """The CPUs that lost at least `least` of their time to steal between two readings:
    {cpu: share}."""
    out = {}
    for cpu, (s1, t1) in (after or {}).items():
        s0, t0 = (before or {}).get(cpu, (s1, t1))
        if t1 > t0 and (s1 - s0) / (t1 - t0) >= least:
            out[cpu] = round((s1 - s0) / (t1 - t0), 3)
    return out


def gpu_clock():
    """The first GPU's SM clock (MHz), temperature (C) and power draw (W) from nvidia-smi;
    None where there is no nvidia-smi (the CPU rehearsal)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout.splitlines()  # fmt: skip
        sm, temp, power = (x.strip() for x in out[0].split(","))
        return dict(sm_mhz=int(float(sm)), temp_c=int(float(temp)), power_w=round(float(power), 1))
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None
