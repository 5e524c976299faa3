"""Batch-1 timing in turns (bench/acceptance/turns.py, serve.py's batch1, speedup.py's
by_turn): the engines take the GPU one group of prompts at a time, in a rotating order, never
two at once; a dead engine does not stop the others; the speed table pairs each turn."""

import subprocess
import sys
import threading
import time

import pytest
from factories import ROOT

sys.path.insert(0, str(ROOT))

from bench.acceptance.serve import batch1  # noqa: E402
from bench.acceptance.speedup import by_turn, group_speeds, host_over_groups  # noqa: E402
from bench.acceptance.turns import (  # noqa: E402
    Turns,
    cpu_times,
    hand_turns,
    proc_cpu,
    proc_cpu_share,
    steal_by_cpu,
    steal_share,
    stolen_cpus,
)


def _engine(folder, name, groups, log, lock, die_after=None):
    t = Turns(folder, name, poll_s=0.001)
    for j in range(groups):
        if die_after is not None and j == die_after:
            return  # gone without a done file
        t.wait(j)
        with lock:
            log.append(("start", name, j, time.perf_counter()))
        time.sleep(0.01)
        with lock:
            log.append(("end", name, j, time.perf_counter()))
        t.done(j, last=j == groups - 1)


def _run(tmp_path, specs):
    log, lock, threads = [], threading.Lock(), {}
    for name, groups, die in specs:
        th = threading.Thread(target=_engine, args=(tmp_path, name, groups, log, lock, die))
        th.start()
        threads[name] = th
    order = hand_turns(tmp_path, [s[0] for s in specs], alive=lambda n: threads[n].is_alive(),
                       poll_s=0.001)  # fmt: skip
    for th in threads.values():
        th.join(timeout=10)
    return order, log


def test_turns_rotate_and_never_overlap(tmp_path):
    order, log = _run(tmp_path, [("plain", 3, None), ("s3-1-4", 3, None), ("s3-4-8", 3, None)])
    assert order == [(0, "plain"), (0, "s3-1-4"), (0, "s3-4-8"),
                     (1, "s3-1-4"), (1, "s3-4-8"), (1, "plain"),
                     (2, "s3-4-8"), (2, "plain"), (2, "s3-1-4")]  # fmt: skip
    # one engine on the GPU at a time: each group ends before the next starts
    ev = sorted(log, key=lambda e: e[3])
    assert [e[0] for e in ev] == ["start", "end"] * 9
    assert all(ev[i][1:3] == ev[i + 1][1:3] for i in range(0, 18, 2))


def test_a_dead_engine_does_not_stop_the_turns(tmp_path):
    order, _ = _run(tmp_path, [("plain", 3, None), ("broken", 3, 1)])
    assert order == [(0, "plain"), (0, "broken"), (1, "plain"), (2, "plain")]


class _Engine:
    """Stands in for sglang.Engine's generate in batch1's bookkeeping (which prompts went in
    which group, their tokens and wall times): not SGLang's behaviour."""

    def generate(self, input_ids, sampling_params):
        time.sleep(0.001)
        return [dict(meta_info=dict(completion_tokens=len(p) * 2, spec_verify_ct=len(p)))
                for p in input_ids]  # fmt: skip


def test_batch1_groups_its_prompts_and_keeps_each_prompt(tmp_path):
    prompts = [[1] * n for n in (1, 2, 3, 4, 5)]
    got, outs = batch1(_Engine(), prompts, {}, group=2)
    assert len(outs) == 5 and got["prompts"] == 5 and not got["in_turns"]
    assert [(g["turn"], g["first"], g["prompts"]) for g in got["groups"]] == [
        (0, 0, 2), (1, 2, 2), (2, 4, 1)]  # fmt: skip
    assert [r[:2] for r in got["per_prompt"]] == [[2, 1], [4, 2], [6, 3], [8, 4], [10, 5]]
    assert got["completion_tokens"] == 30 and got["accept_length"] == 2.0
    for g in got["groups"]:  # a group's wall time is its prompts'
        walls = [r[2] for r in got["per_prompt"][g["first"] : g["first"] + g["prompts"]]]
        assert abs(g["wall_s"] - sum(walls)) < 1e-3
    # in turns: it waits for each turn and says when it is done
    th = threading.Thread(target=lambda: hand_turns(tmp_path, ["x"], alive=lambda n: True,
                                                    poll_s=0.001))  # fmt: skip
    th.start()
    got, _ = batch1(_Engine(), prompts, {}, group=2, turns=Turns(tmp_path, "x", poll_s=0.001))
    th.join(timeout=10)
    assert not th.is_alive() and got["in_turns"]
    assert got["turns_session"] == (tmp_path / "turn-x-2").read_text().strip()
    assert sorted(p.name for p in tmp_path.glob("done-x-*")) == ["done-x-0", "done-x-1", "done-x-2"]
    assert (tmp_path / "done-x-2").read_text() == "last\n"


def test_steal_share_from_proc_stat():
    assert steal_share([0] * 8, [50, 0, 25, 20, 0, 0, 0, 5]) == 0.05
    assert steal_share(None, [1] * 8) is None and steal_share([1] * 8, [1] * 8) is None
    now = cpu_times()  # this machine's /proc/stat: user .. steal
    assert now is None or (len(now) == 8 and all(x >= 0 for x in now))


def test_busy_processes_and_stolen_cpus():
    # a child that spins for 0.5 s (then says so and sleeps) and one that sleeps: only the
    # spinning one is busy, most of the wall time (an engine's scheduler in a CPU-bound round)
    spin = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
            "print('spun', flush=True)\ntime.sleep(2)\n")  # fmt: skip
    before, t0 = proc_cpu(), time.time()
    kids = [subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True),
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])]  # fmt: skip
    assert kids[0].stdout.readline().strip() == "spun"
    after, wall = proc_cpu(), time.time() - t0
    for k in kids:
        k.kill()
        k.wait()
    assert kids[0].pid in after and kids[1].pid in after  # descendants of this process
    name, ticks, cpu = after[kids[0].pid]
    assert name.startswith("python") and ticks > 0 and cpu >= 0
    busy = proc_cpu_share(before, after, wall)  # every process, the busiest first
    spinner = proc_cpu_share(before, {kids[0].pid: after[kids[0].pid]}, wall)
    sleeper = proc_cpu_share(before, {kids[1].pid: after[kids[1].pid]}, wall)
    assert spinner and spinner[0][1] >= 0.3, busy  # 0.5 s of CPU in under 1.7 s of wall
    assert busy[0] == spinner[0], busy
    assert not sleeper or sleeper[0][1] < spinner[0][1] / 2, busy
    assert proc_cpu_share({}, after, wall) == []  # nothing read before: no shares
    now = steal_by_cpu()  # this machine's per-CPU lines: steal <= total
    assert now and all(0 <= st <= tot for st, tot in now.values())
    assert stolen_cpus({0: [10, 100], 1: [5, 100]}, {0: [30, 200], 1: [5, 200]}) == {0: 0.2}
    assert stolen_cpus(None, {0: [1, 1]}) == {}


def test_speed_by_turn_pairs_the_same_prompts():
    # plain: 2 groups of 2 prompts, 100 tokens each, 0.2 s a group -> 1000 tok/s
    pp = [[100, 0, 0.1]] * 4
    plain = dict(in_turns=True, per_prompt=pp,
                 groups=[dict(turn=0, first=0, prompts=2, wall_s=0.2),
                         dict(turn=1, first=2, prompts=2, wall_s=0.2,
                              steal_share=0.01, gpu_before=dict(sm_mhz=1980),
                              gpu_after=dict(sm_mhz=1755))])  # fmt: skip
    # the drafter: 1.5x in turn 0, 1.2x in turn 1 (the host slowed down for both)
    row = dict(in_turns=True, per_prompt=[[100, 40, 0.1]] * 4,
               groups=[dict(turn=0, first=0, prompts=2, wall_s=0.2 / 1.5),
                       dict(turn=1, first=2, prompts=2, wall_s=0.2 / 1.2)])  # fmt: skip
    assert group_speeds(plain) == {0: 1000.0, 1: 1000.0}
    assert by_turn(row, plain) == dict(turns=2, median=1.5, min=1.2, max=1.5)
    assert by_turn(row, dict(plain, in_turns=False)) is None  # timed apart: no pairs
    assert by_turn(dict(row, turns_session="b"), dict(plain, turns_session="a")) is None
    assert host_over_groups(plain) == dict(groups=2, steal_share_max=0.01, sm_mhz_min=1755,
                                           sm_mhz_max=1980, busiest_min=None,
                                           busiest_max=None)  # fmt: skip
    plain["groups"][0]["busy"] = [["sglang::schedul", 0.97, 3], ["python3", 0.1, 5]]
    plain["groups"][1]["busy"] = [["sglang::schedul", 0.62, 4]]
    assert host_over_groups(plain)["busiest_min"] == 0.62
    assert host_over_groups(plain)["busiest_max"] == 0.97
    assert host_over_groups(dict(per_prompt=pp)) is None


@pytest.mark.parametrize(
    "main, argv, flags",
    [
        ("bench.acceptance.cli", ["run-all", "--help"], ["--serve-turns"]),
        (
            "bench.acceptance.speculators.cli",
            ["serve", "--help"],
            ["--turns", "--turn-prompts", "--freeze-gc"],
        ),
    ],
)
def test_the_turn_options_are_there(capsys, main, argv, flags):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(main).main(argv)
    out = capsys.readouterr().out
    assert all(f in out for f in flags)
