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


# test files whose tests share no module-scoped fixture and each start their own engine:
# under `--dist loadgroup` (make test) their tests are spread over the workers one by one
SPREAD = ("test_families.py",)


# the fast tier's slowest files, slowest first (measured 2026-12-02: each one's tests took
# 35-95 s on a worker): `make test-fast` (`--dist loadfile --no-loadscope-reorder`) hands the
# files out in collection order, so these start first and neither worker is left with one of
# them at the end. (Without --no-loadscope-reorder, xdist orders the files by test count.)
FIRST = (
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
    "test_idle.py",
)


def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup`: every test in the group of its file (what `--dist loadfile` does:
    a module's fixtures are built once, in one worker), except the files in SPREAD, whose
    tests get a group each, so that two of their engines run at once. The files in FIRST
    come first, in that order (each file's tests keep theirs)."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        name = item.nodeid if item.path.name in SPREAD else item.path.name
        item.add_marker(pytest.mark.xdist_group(name))
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
