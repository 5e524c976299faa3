import os
import sys

import pytest
from factories import ROOT

sys.path.insert(0, str(ROOT))

FORBID_ENV = "HSDUMP_FORBID_ENGINE"  # hsdump.capture.engine.FORBID_ENV (imported lazily there)


def pytest_configure(config):
    """Under pytest-xdist (`-n N`), each worker gets its share of the cores: torch's intra-op
    threads in the worker and, through OMP_NUM_THREADS, in every process it starts (extract.py
    runs, SGLang's scheduler processes), so N workers do not run N times the machine's threads.
    (SGLANG_CPU_OMP_THREADS_BIND is not used: SGLang binds threads only on AMX or arm64 CPUs,
    and with it set sizes its memory pool differently.) A test that sets the variable keeps it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if not worker or count < 2:
        return
    threads = max(1, (os.cpu_count() or 1) // count)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)


# test files whose tests share no module-scoped fixture and each start their own engine: their
# tests are spread over the workers one by one (`make test`); every other file runs whole on one
# worker, so its module fixtures (test_engine's shared engine, test_ray's cluster, test_hostile's
# cases) are built once
SPREAD = ("test_families.py", "test_kinds.py")


# the fast tier's slowest files, slowest first (measured 2026-12-02: each one's tests took
# 35-95 s on a worker): the workers take units in collection order, so these start first and
# neither worker is left alone with one of them at the end; every other file (the engine files
# included) follows in collection order. The two longest engine files lead (2026-12-06, a clean
# clone's CI: each ~4-5 min on a worker, and test_recipes.py, last in collection order, ran at
# the end alone): one on each worker, the rest fills in around them. Before them, the longest
# unit: tests/test_qwen_coder.py (a 1.5B model fetched, built, captured and checked against
# transformers: 4 min 30 s on one thread from an empty HSDUMP_CACHE, 2 min 58 s with the model
# built; peak RSS 11.4 GB; 2026-12-07), whose worker takes no other file while its engine tests
# run (they lead the file, so more than two of its tests are pending)
FIRST = (
    "test_qwen_coder.py",
    "test_recipes.py",
    "test_acceptance_train.py",
    "test_data.py",
    "test_package.py",
    "test_ray.py",
    "test_own_model.py",
    "test_launch.py",
    "test_hostile.py",
    "test_errors.py",
    "test_own_data.py",
    "test_refusals.py",
    "test_family_gate.py",
    "test_preview.py",
    "test_regenerate.py",
    "test_online.py",  # 26-47 s on a worker (2026-12-04)
    "test_idle.py",
    "test_tiers.py",  # its nested two-worker pytest: ~18 s on one worker
)


def scope(nodeid: str) -> str:
    """The unit a worker runs whole: the test's file, or the test itself in a SPREAD file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path.rsplit("/", 1)[-1] in SPREAD else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n N --dist loadscope` (make test, make test-fast) with hsdump's scopes (`scope`), the
    units in collection order (`--no-loadscope-reorder`: FIRST's). Here and not through
    `xdist_group` marks and `--dist loadgroup`: pytest-xdist 3.8 tags a grouped test by
    rewriting `item._nodeid`, which pytest 9.2 no longer reads (its node ids live in `_id`), so
    under loadgroup every test was a unit of its own and module fixtures were built on both
    workers (tests/test_tiers.py checks the units)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Scheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The files in FIRST come first, in that order (each file's tests keep theirs)."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


@pytest.fixture(autouse=True)
def engine_guard(request, monkeypatch):
    """The tiers' guard (docs/development.md): a test not marked `engine` or `gpu` runs in
    `make test-fast` and must start no SGLang engine, in this process or a subprocess (the
    variable is inherited): hsdump.capture.engine raises, naming the test."""
    if request.node.get_closest_marker("engine") or request.node.get_closest_marker("gpu"):
        monkeypatch.delenv(FORBID_ENV, raising=False)
    else:
        monkeypatch.setenv(FORBID_ENV, request.node.nodeid)
    yield


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("tiny:llama")


@pytest.fixture(scope="session")
def tiny_qwen3() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("tiny:qwen3")
