import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def tiny_llama() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("tiny:llama")


@pytest.fixture(scope="session")
def tiny_qwen3() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("tiny:qwen3")


def cpu_engine_config(**over):
    """The engine settings of conf/engine/cpu.yaml, as the dataclass."""
    from omegaconf import OmegaConf

    from hsdump.config import EngineConfig

    raw = OmegaConf.load(ROOT / "conf" / "engine" / "cpu.yaml")
    raw.pop("defaults", None)
    kw = OmegaConf.to_container(raw)
    kw.update(over)
    return EngineConfig(**kw)
