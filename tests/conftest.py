import sys

import pytest
from factories import ROOT

sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("tiny:llama")


@pytest.fixture(scope="session")
def tiny_qwen3() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("tiny:qwen3")
