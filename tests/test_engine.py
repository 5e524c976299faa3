"""Real SGLang engine on the CPU (tiny random models) against a transformers forward pass.

Tolerance: the engine runs in bf16 and transformers in float32 on the same bf16 weights. bf16
keeps 8 significant bits, so every matmul and norm rounds at ~2^-9 = 0.002 relative; through
a few layers that accumulates to ~0.5%. The reference for what bf16 costs is transformers' own
bf16 forward on the same inputs: the engine's error must stay within 3x that (plus 0.002),
while the neighbouring layer (an off-by-one) is far outside it.
"""

import pytest
import torch
from factories import cpu_engine_config, hf_hidden_states, hf_model
from tolerance import neighbours, per_sample_ok, rel_err

pytestmark = pytest.mark.engine

LAYERS = [5, 1, 3, 7]  # hf_hidden_states_index, deliberately unsorted; the tiny models have 8
LENGTHS = [5, 17, 40, 64, 128, 3]
CHUNKED = [64, 10, 50, 5, 33]  # with 16-token chunks: see test_chunked_prefill_rows_are_stitched
FINAL_LENGTHS = [9, 31, 70]
FINAL = ["post_norm", "pre_norm"]


def prompts(lengths, seed, first_id=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (first_id + i, torch.randint(10, 120000, (n,), generator=g).tolist())
        for i, n in enumerate(lengths)
    ]


def capture(model_path, layers, samples, final=(), **engine_over):
    """{sid: (input_ids, [rows per layer, then per final kind])} from one real CPU engine."""
    from hsdump.capture.base import Request
    from hsdump.capture.start import start

    got = {}
    eng = start(model_path, layers, cpu_engine_config(**engine_over), final=final)
    try:
        eng.run(
            [Request(sid, ids) for sid, ids in samples],
            lambda s: got.__setitem__(s.sid, (s.input_ids, [h.clone() for h in s.rows])),
        )
    finally:
        eng.close()
    return got


@pytest.fixture(scope="module")
def llama_run(tiny_llama):
    """One real engine for the tests that only read its rows (batched capture, chunked prefill,
    final states): 16-token chunks, so every prompt but the shortest spans several chunks and
    the short ones beside them are split to fill chunks (the case that loses rows in SGLang's
    own path), the LAYERS and both final kinds."""
    samples = {
        "batched": prompts(LENGTHS, 0),
        "chunked": prompts(CHUNKED, 1, first_id=100),
        "final": prompts(FINAL_LENGTHS, 2, first_id=200),
    }
    every = [s for group in samples.values() for s in group]
    got = capture(
        tiny_llama, LAYERS, every, final=FINAL, chunked_prefill_size=16, max_prefill_tokens=16
    )
    return samples, got


def check_against_transformers(model_path, layers, samples, got):
    assert set(sid for sid, _ in samples) <= set(got)
    worst = 0.0
    for sid, ids in samples:
        out_ids, hs = got[sid]
        assert out_ids == ids
        ref = hf_hidden_states(model_path, ids, torch.float32)
        ref16 = hf_hidden_states(model_path, ids, torch.bfloat16)
        assert len(hs) >= len(layers)
        for h, k in zip(hs, layers):
            assert h.shape == (len(ids), ref[k].shape[-1]) and h.dtype == torch.bfloat16
            err, scale = rel_err(h, ref[k]), rel_err(ref16[k], ref[k])
            assert per_sample_ok(err, scale), (sid, k, err, scale)
            nb = neighbours(h, ref, k)  # an off-by-one fails loudly
            assert nb.ok, (sid, k, nb.failures(f"layer {k}"))
            worst = max(worst, err)
    return worst


# (Qwen3's model class, prefill without chunks: tests/test_families.py's qwen3, the same rules on
# a batch of three chats through extract.py; its run of tiny:qwen3 here was one more engine)
def test_batched_capture_matches_transformers_llama(llama_run, tiny_llama):
    samples, got = llama_run
    worst = check_against_transformers(tiny_llama, LAYERS, samples["batched"], got)
    print(f"llama: worst relative error {worst:.4f}")


def test_chunked_prefill_rows_are_stitched(llama_run, tiny_llama):
    # 16-token chunks: the 64- and 50-token prompts span 4 chunks, and the short prompts
    # beside them get split to fill chunks (the case that loses rows in SGLang's own path).
    samples, got = llama_run
    assert sorted(got) == sorted(sid for group in samples.values() for sid, _ in group)
    check_against_transformers(tiny_llama, LAYERS, samples["chunked"], got)


def test_final_layer_states_match_transformers(llama_run, tiny_llama):
    samples, got = llama_run
    model = hf_model(tiny_llama, torch.float32)
    seen = {}
    hook = model.model.norm.register_forward_hook(
        lambda m, a, out: seen.update(pre=a[0][0].float(), post=out[0].float())
    )
    try:
        for sid, ids in samples["final"]:
            with torch.no_grad():
                hs_ref = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            _, rows = got[sid]  # layers first, then final states in FINAL's (the spec's) order
            assert len(rows) == len(LAYERS) + 2
            layer3, post, pre = rows[LAYERS.index(3)], rows[-2], rows[-1]
            assert rel_err(layer3, hs_ref[3][0]) < 0.02
            assert rel_err(pre, seen["pre"]) < 0.02, "pre_norm: the last layer's raw output"
            assert rel_err(post, seen["post"]) < 0.02, "post_norm: after the final norm"
            assert rel_err(pre, seen["post"]) > 0.1  # the two are really different tensors
    finally:
        hook.remove()


def test_nonfinite_rows_are_flagged_per_request(tiny_llama, tmp_path):
    # token 77's embedding is +Inf: every captured row of a prompt from that token on is NaN,
    # while the prompts batched beside it stay finite. The engine flags exactly that request
    # (device-side check), in the user's slot order, and the writer skips it on that flag.
    import shutil

    from safetensors.torch import load_file, save_file

    from hsdump.capture.base import Request
    from hsdump.capture.layers import read_model_info
    from hsdump.capture.start import start
    from hsdump.store.manifest import Manifest
    from hsdump.store.writer import DatasetWriter

    bad_model = tmp_path / "model"
    shutil.copytree(tiny_llama, bad_model)
    w = load_file(bad_model / "model.safetensors")
    w["model.embed_tokens.weight"][77] = float("inf")
    save_file(w, bad_model / "model.safetensors", metadata={"format": "pt"})
    info = read_model_info(str(bad_model))
    g = torch.Generator().manual_seed(3)
    samples = [
        (i, torch.randint(100, 120000, (n,), generator=g).tolist())
        for i, n in enumerate([20, 40, 30, 12])
    ]
    samples[1][1][25] = 77  # sample 1 only, from position 25 on
    got = {}
    eng = start(str(bad_model), [3, 1], cpu_engine_config(), info=info, final=["post_norm"])
    try:
        eng.run(
            [Request(sid, ids) for sid, ids in samples],
            lambda s: got.__setitem__(s.sid, ([h.clone() for h in s.rows], s.nonfinite)),
        )
    finally:
        eng.close()
    assert sorted(got) == [0, 1, 2, 3]
    for sid, (hs, bad) in got.items():
        finite = [bool(torch.isfinite(h).all()) for h in hs]
        assert bad == [j for j, ok in enumerate(finite) if not ok], (sid, bad, finite)
        assert bad == ([0, 1, 2] if sid == 1 else []), (sid, bad)

    manifest = Manifest.for_rows(
        model=str(bad_model),
        hidden_size=info.hidden_size,
        num_hidden_layers=info.num_hidden_layers,
        layers=[3, 1],
        final=["post_norm"],
    )
    writer = DatasetWriter(str(tmp_path / "ds"), manifest, on_nonfinite="skip")
    for sid, ids in samples:
        hs, bad = got[sid]
        writer.add(sid, ids, [1] * len(ids), hs[:2], {"post_norm": hs[2]}, nonfinite=bad)
    writer.close()
    from factories import committed, skipped

    assert skipped(tmp_path / "ds") == {1: "nonfinite in hidden_states[0]"}
    assert sorted(committed(tmp_path / "ds")) == [0, 2, 3]
