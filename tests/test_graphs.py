"""Start-time settings a run gives SGLang (serving.start_kwargs): decode CUDA graphs only for a run
that generates, prefill graphs as engine.prefill_cuda_graph_max_tokens says, and every key a
real SGLang ServerArgs field (the GPU start-time figures are docs/performance.md, "Engine start")."""

import dataclasses

import pytest
from factories import ROOT

from hsdump.capture.serving import start_kwargs
from hsdump.config import EngineConfig


def gpu(**kw):
    return EngineConfig(device="cuda", flashinfer_allreduce_fusion=True, **kw)


def test_capture_run_drops_decode_graphs():
    assert start_kwargs(gpu(), generates=False) == {"disable_decode_cuda_graph": True}


def test_generating_run_keeps_decode_graphs():
    assert start_kwargs(gpu(), generates=True) == {}
    assert start_kwargs(gpu(decode_cuda_graph=False), generates=True) == {
        "disable_decode_cuda_graph": True
    }
    assert start_kwargs(gpu(decode_cuda_graph=True), generates=False) == {}


def test_prefill_graph_sizes():
    assert start_kwargs(gpu(prefill_cuda_graph_max_tokens=0), generates=True) == {
        "disable_prefill_cuda_graph": True
    }
    assert start_kwargs(gpu(prefill_cuda_graph_max_tokens=2048), generates=True) == {
        "cuda_graph_max_bs_prefill": 2048
    }
    with pytest.raises(ValueError, match="prefill_cuda_graph_max_tokens"):
        gpu(prefill_cuda_graph_max_tokens=-1)


def test_nothing_on_cpu_or_with_graphs_off():
    assert start_kwargs(EngineConfig(device="cpu", prefill_cuda_graph_max_tokens=0), False) == {}
    assert start_kwargs(gpu(disable_cuda_graph=True, prefill_cuda_graph_max_tokens=0), False) == {}


def test_flashinfer_allreduce_fusion_off_unless_asked():
    off = {"enforce_disable_flashinfer_allreduce_fusion": True}
    assert start_kwargs(EngineConfig(device="cuda", disable_cuda_graph=True), False) == off
    assert start_kwargs(EngineConfig(device="cuda"), True) == off


def test_gpu_preset_and_keys_are_sglang_server_args():
    from hydra import compose, initialize_config_dir

    from hsdump.config import register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = to_config(compose("config", overrides=["engine=gpu"]))
    kw = start_kwargs(cfg.engine, generates=False)
    assert kw == {
        "disable_decode_cuda_graph": True,
        "disable_prefill_cuda_graph": True,
        "enforce_disable_flashinfer_allreduce_fusion": True,
        "watchdog_timeout": 1800,
    }
    kw.update(start_kwargs(gpu(prefill_cuda_graph_max_tokens=64), generates=False))
    from sglang.srt.server_args import ServerArgs

    fields = set(getattr(ServerArgs, "__struct_fields__", ()))  # a msgspec Struct (0.5.23)
    if not fields:
        fields = {f.name for f in dataclasses.fields(ServerArgs)}  # a dataclass (0.5.17)
    assert set(kw) <= fields, set(kw) - fields
