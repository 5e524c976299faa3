"""Fidelity of hsdump's captured hidden states on a GPU, against transformers in float32.

Per case (CASES: one engine each): a tiny random Llama or DeepSeek-V3 (MLA + MoE) checkpoint
(hsdump.testing.models: llama-small, dsv3-small; 6 layers), prompts of 7, 33, 200 and 1000
tokens, layers [1, 3, 5, 4] in the hf_hidden_states_index convention (unsorted on purpose:
hsdump puts SGLang's sorted aux rows back in the asked order), captured through
hsdump.capture.start's engine with conf/engine/gpu.yaml, written with DatasetWriter and read
back with HsdumpDataset; then hsdump.check's comparison with transformers' float32 forward of
the same weights (Llama: rule 1 per sample and the neighbour margin; the MoE model: rule 2, as
before; both: every sample's rows closest to their own index; the rules and their measurements
are in hsdump/check.py, the MoE exception in tests/gpu.py's `failures`). The chunked cases use
256-token chunks: the 1000-token prompt spans 4 chunks and the short prompts are split to fill
chunks; every row must still arrive, in order, at the right layer (their rows against the
unchunked case's are recorded too).

Run on a GPU machine: python3 -m pytest -q -s tests/test_gpu.py (tests/gpu.py: HSDUMP_GPU_RESULTS
writes each case's figures, HSDUMP_GPU_ENGINE caps the engine's memory beside other checks).
"""

import time

import pytest
import torch
from gpu import engine_over, failures, save

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)"),
]

PROMPT_LENS = (7, 33, 200, 1000)
LAYERS = [1, 3, 5, 4]
MODELS = {"llama": "llama-small", "deepseek_v3": "dsv3-small"}
CASES = {  # case -> (family, chunked_prefill_size)
    "llama": ("llama", -1),
    "deepseek_v3": ("deepseek_v3", -1),
    "llama@256": ("llama", 256),
    "deepseek_v3@256": ("deepseek_v3", 256),
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The checkpoints, transformers' references and the unchunked records, built once."""
    return {"dir": tmp_path_factory.mktemp("gpu"), "ref": {}, "records": {}}


def capture(model_path: str, prompts, out, chunk: int, preset: str = "gpu") -> dict:
    """The prompts through the engine into a dataset at `out`, read back (`preset`: cpu runs
    this file's code on SGLang's CPU engine, by hand, for the Llama cases)."""
    from hsdump.capture.base import Request
    from hsdump.capture.layers import read_model_info
    from hsdump.capture.start import engine_preset, rows_manifest, start
    from hsdump.store.reader import HsdumpDataset
    from hsdump.store.writer import DatasetWriter

    info = read_model_info(model_path)
    manifest = rows_manifest(model_path, LAYERS, info)
    ec = engine_preset(preset, chunked_prefill_size=chunk, **engine_over())
    writer = DatasetWriter(str(out), manifest, overwrite=True)
    t0 = time.time()
    try:
        with start(model_path, LAYERS, ec, info=info) as eng:
            t1 = time.time()
            eng.run(
                [Request(sid, ids, [1] * len(ids)) for sid, ids in enumerate(prompts)],
                writer.add_sample,
            )
            t2, version = time.time(), eng.version
    finally:
        writer.close()
    ds = HsdumpDataset(str(out))
    assert ds.layers == LAYERS, (ds.layers, LAYERS)
    recs = [ds.get(sid) for sid in sorted(ds.ids)]
    ds.close()
    return {"records": recs, "engine_start_s": t1 - t0, "capture_s": t2 - t1, "sglang": version}


def run_case(case: str, shared, device: str = "cuda") -> dict:
    from hsdump import check
    from hsdump.testing import models

    family, chunk = CASES[case]
    d = shared["dir"]
    path = models.build(MODELS[family], d / f"model-{family}")
    prompts = models.prompts(PROMPT_LENS)
    preset = "gpu" if device == "cuda" else "cpu"
    cap = capture(path, prompts, d / f"ds-{case.replace('@', '-')}", chunk, preset)
    recs = cap.pop("records")
    problems = [f"{len(recs)} samples in the dataset, {len(prompts)} prompts"] * (
        len(recs) != len(prompts)
    )
    problems += [
        f"sample {r['id']}: stored input_ids differ from the prompt"
        for r, p in zip(recs, prompts)
        if r["input_ids"].tolist() != p
    ]
    if family not in shared["ref"]:
        shared["ref"][family] = check.reference(path, prompts, device=device)
    layers = check.compare_layers(LAYERS, recs, shared["ref"][family])
    res = {
        "case": case,
        "chunked_prefill_size": chunk,
        "prompt_lens": list(PROMPT_LENS),
        "moe": shared["ref"][family]["moe"],
        "layers": [r.to_dict() for r in layers],
        "problems": problems,
        **{k: round(v, 1) if isinstance(v, float) else v for k, v in cap.items()},
    }
    if chunk == -1:
        shared["records"][family] = recs
    elif family in shared["records"]:  # the same rows as without chunks, to bf16 noise
        base = shared["records"][family]
        res["vs_unchunked"] = {
            str(k): [
                check.rel_err(a["hidden_states"][j], b["hidden_states"][j])
                for a, b in zip(recs, base)
            ]
            for j, k in enumerate(LAYERS)
        }
    save(f"gpu-check-{case.replace('@', '-')}", res)
    for r in layers:  # the measured errors, for the record (run with -s to see them)
        print(
            f"{case} layer {r.index}: hsdump worst {max(r.err):.4f} | hf bf16 worst "
            f"{max(r.hf_bf16):.4f} | {r.neighbour}"
        )
    return {"res": res, "failures": problems + failures(layers, res["moe"])}


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_fidelity(family, shared):
    out = run_case(family, shared)
    assert [r["index"] for r in out["res"]["layers"]] == LAYERS
    assert not out["failures"], "\n".join(out["failures"])


@pytest.mark.parametrize("family", ["llama", "deepseek_v3"])
def test_chunked_prefill(family, shared):
    out = run_case(f"{family}@256", shared)
    assert not out["failures"], "\n".join(out["failures"])
