import sys

import pytest
from factories import ROOT

sys.path.insert(0, str(ROOT))

FORBID_ENV = "HSDUMP_FORBID_ENGINE"  # hsdump.capture.engine.FORBID_ENV (imported lazily there)


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
