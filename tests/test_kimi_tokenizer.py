"""Kimi's tokenizer without running the checkpoint's code (hsdump.corpus.tiktoken_tokenizer).

A small tokenizer folder in Kimi-K2.5's layout (tiktoken.model + tokenizer_config.json, Kimi's
special-token ids) is loaded through `load_tokenizer` with trust_remote_code=false and
compared with `tiktoken` itself (the library Kimi's own TikTokenTokenizer encodes with) on the
same ranks, Kimi's split pattern and its special tokens.
"""

import json
import random
import shutil

import pytest
from factories import mask_runs

from hsdump.config import ModelConfig
from hsdump.corpus.tiktoken_tokenizer import (
    KIMI_PATTERN,
    build_kimi_tokenizer,
    kimi_added_tokens,
    read_tiktoken_bpe,
    write_kimi_style_tokenizer,
    write_tiktoken_bpe,
)
from hsdump.corpus.tokenizer import load_tokenizer, tokenizer_sha256

TEXTS = [
    "Hello world! How's it going? I'M FINE, they'll see.",
    "你好，世界！我们今天学习数学和物理。北京天气怎么样？",
    "mixed 中文English混合text 123中456",
    "digits 1 12 123 1234 12345678901 3.14159 -42 1e10",
    "whitespace  runs   here\t\ttabs\n\nnewlines\r\n\r\n   \n  trailing   ",
    "punctuation!!! ... ??? ,,, ;;; --- (a) [b] {c} <d> \"q\" 'q' `code` @#$%^&*~",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "ÉCOLE déjà vu naïve café Ünïcödé ǅemal ʰmod",
    "日本語のテキストとカタカナ、한국어 텍스트, русский текст, العربية",
    "emoji 😀🎉👍🏽 and symbols ∑∫√ ≤≥ ™ ©",
    "<|im_user|>user<|im_middle|>Hi 你好<|im_end|><|im_assistant|>assistant<|im_middle|>"
    "<think>hmm</think>Sure![EOS]",
    "special in text[BOS]mid<|im_end|>end <think> spaced </think> x",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
    '{"a": 1}<|tool_call_end|><|tool_calls_section_end|>',
    "",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    return str(write_kimi_style_tokenizer(tmp_path_factory.mktemp("kimi")))


@pytest.fixture(scope="module")
def kimi_tok(kimi_dir):
    return load_tokenizer(ModelConfig(path=kimi_dir), kimi_dir)


def tiktoken_encoding(folder):
    """The encoding Kimi's TikTokenTokenizer builds from these files (its __init__)."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = read_tiktoken_bpe(f"{folder}/tiktoken.model")
    config = json.loads(open(f"{folder}/tokenizer_config.json").read())
    specials = {c: i for i, c, _ in kimi_added_tokens(config, len(ranks))}
    return tiktoken.Encoding(
        name="kimi-test", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


def random_texts(n, seed=0):
    """Strings drawn from Han, Latin (both cases, accents), digits, spaces, newlines,
    punctuation and the special tokens."""
    rng = random.Random(seed)
    pieces = (
        list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年")
        + list("abcdefghijKLMNOPQRSTéèüÖß'")
        + list("0123456789")
        + [" ", "  ", "\t", "\n", "\r\n", "   \n"]
        + list('.,!?;:()[]{}<>-_=+*/\\"#@%&|~`')
        + [
            "'s",
            "'LL",
            "'re",
            "[BOS]",
            "[EOS]",
            "<|im_end|>",
            "<|im_middle|>",
            "<think>",
            "<|reserved_token_4261|>",
            "😀",
            "é",
            "ǅ",
            "ー",
            "カ",
        ]
    )
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def test_fast_tokenizer_matches_tiktoken(kimi_dir, kimi_tok):
    """Same ids as tiktoken with Kimi's pattern, ranks and special tokens
    (allowed_special="all", as Kimi's class encodes), and the text back from decode."""
    from transformers import PreTrainedTokenizerFast

    assert isinstance(kimi_tok, PreTrainedTokenizerFast) and kimi_tok.is_fast
    enc = tiktoken_encoding(kimi_dir)
    for text in TEXTS + random_texts(300):
        ids = kimi_tok(text, add_special_tokens=False)["input_ids"]
        assert ids == enc.encode(text, allowed_special="all"), text
        assert kimi_tok.decode(ids) == text
    # the vocabulary is a real one: common words are single tokens, Chinese merges too
    assert len(kimi_tok("the", add_special_tokens=False)["input_ids"]) == 1
    assert len(kimi_tok("我们", add_special_tokens=False)["input_ids"]) == 1


def test_special_tokens_and_ids(kimi_dir, kimi_tok):
    base = len(read_tiktoken_bpe(f"{kimi_dir}/tiktoken.model"))
    assert base > 4000  # the 256 bytes and the learned merges
    assert len(kimi_tok) == base + 256
    want = {
        "[BOS]": 0,
        "[EOS]": 1,
        "<|im_end|>": 2,
        "<|im_user|>": 3,
        "<|im_assistant|>": 4,
        "<|im_system|>": 10,
        "<|tool_calls_section_begin|>": 11,
        "<|im_middle|>": 17,
        "<think>": 22,
        "</think>": 23,
        "[UNK]": 254,
        "[PAD]": 255,
        f"<|reserved_token_{base + 5}|>": 5,
        f"<|reserved_token_{base + 100}|>": 100,
    }
    for content, off in want.items():
        assert kimi_tok.convert_tokens_to_ids(content) == base + off, content
        assert kimi_tok(content, add_special_tokens=False)["input_ids"] == [base + off]
    assert (kimi_tok.bos_token, kimi_tok.eos_token) == ("[BOS]", "[EOS]")
    assert (kimi_tok.bos_token_id, kimi_tok.eos_token_id) == (base, base + 1)
    assert (kimi_tok.unk_token, kimi_tok.pad_token) == ("[UNK]", "[PAD]")
    assert "<|im_end|>" in kimi_tok.extra_special_tokens
    # nothing added around the text (Kimi's class adds no bos)
    assert (
        kimi_tok("hello 你好")["input_ids"]
        == kimi_tok("hello 你好", add_special_tokens=False)["input_ids"]
    )
    # special=False in the config (<think>, tool markers) survive skip_special_tokens
    ids = kimi_tok("[BOS]<think>a</think><|im_end|>", add_special_tokens=False)["input_ids"]
    assert kimi_tok.decode(ids, skip_special_tokens=True) == "<think>a</think>"


def test_writer_is_deterministic(kimi_dir, tmp_path):
    again = write_kimi_style_tokenizer(tmp_path / "again")
    for name in ("tiktoken.model", "tokenizer_config.json"):
        assert (again / name).read_bytes() == open(f"{kimi_dir}/{name}", "rb").read()
    config = json.loads((again / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "TikTokenTokenizer" and "chat_template" not in config
    assert len(config["added_tokens_decoder"]) == 256


def test_small_vocabulary_and_sparse_config(tmp_path):
    """A hand-made vocabulary and a config naming only some ids (Kimi-K2's first configs):
    the others are <|reserved_token_ID|>, as Kimi's class names them."""
    ranks = {bytes([b]): b for b in range(256)}
    for tok in (b"ab", b"abc", b" a", b"\xe4\xbd", b"\xe4\xbd\xa0", b"12", b"123", b"  "):
        ranks[tok] = len(ranks)
    write_tiktoken_bpe(tmp_path / "tiktoken.model", ranks)
    base = len(ranks)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "added_tokens_decoder": {
                    str(base): {"content": "[BOS]", "special": True},
                    str(base + 1): {"content": "[EOS]", "special": True},
                    str(base + 2): {"content": "<|im_end|>", "special": True},
                }
            }
        )
    )
    tok = load_tokenizer(ModelConfig(path=str(tmp_path)), str(tmp_path))
    enc = tiktoken_encoding(tmp_path)
    assert len(tok) == base + 256
    assert tok.convert_tokens_to_ids(f"<|reserved_token_{base + 3}|>") == base + 3
    for text in (
        TEXTS + ["abcab abc 你你好 12312 1234", "[BOS]abc<|im_end|>"] + random_texts(100, 1)
    ):
        assert tok(text, add_special_tokens=False)["input_ids"] == enc.encode(
            text, allowed_special="all"
        ), text


def test_kimi_k25_template_masks(kimi_dir):
    """kimi_k25.jinja through hsdump's mask path: the loss covers exactly each assistant
    turn's `</think>` + content + `<|im_end|>`, and the ids are the rendered text's."""
    from hsdump.corpus.chat import chat_spans
    from hsdump.corpus.masks import tokenize_conversation

    tok = load_tokenizer(ModelConfig(path=kimi_dir, chat_template="kimi_k25.jinja"), kimi_dir)
    messages = [
        {"role": "user", "content": "What is 2+2? 用中文回答。"},
        {"role": "assistant", "content": "2+2 等于 4。"},
        {"role": "user", "content": "And  3*3?\n"},
        {"role": "assistant", "content": "Nine (9), i.e. 九."},
    ]
    ids, mask = tokenize_conversation(tok, messages)
    text, _ = chat_spans(tok, messages, None, tok.chat_template)
    assert text.startswith("<|im_system|>system<|im_middle|>You are Kimi")
    assert ids == tiktoken_encoding(kimi_dir).encode(text, allowed_special="all")
    runs = mask_runs(ids, mask)
    assert [tok.decode(r) for r in runs] == [
        f"</think>{m['content']}<|im_end|>" for m in messages if m["role"] == "assistant"
    ]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_end) == 5 and sum(mask) == sum(len(r) for r in runs)
    # the user turns, headers and <think> prefills are out of the loss
    think = tok.convert_tokens_to_ids("<think>")
    assert all(m == 0 for i, m in zip(ids, mask) if i == think)


def test_tokenizer_sha256(kimi_dir, kimi_tok, tmp_path):
    again = load_tokenizer(ModelConfig(path=kimi_dir), kimi_dir)
    assert tokenizer_sha256(again) == tokenizer_sha256(kimi_tok)
    other = write_kimi_style_tokenizer(tmp_path / "small", num_merges=500)
    assert tokenizer_sha256(
        load_tokenizer(ModelConfig(path=str(other)), str(other))
    ) != tokenizer_sha256(kimi_tok)


def test_missing_files_named(kimi_dir, tmp_path):
    only_bpe = tmp_path / "only_bpe"
    only_bpe.mkdir()
    shutil.copy(f"{kimi_dir}/tiktoken.model", only_bpe)
    with pytest.raises(
        ValueError,
        match=r"model\.tokenizer=.*tiktoken\.model but no "
        r"tokenizer_config\.json.*model\.trust_remote_code",
    ):
        load_tokenizer(ModelConfig(path="unused", tokenizer=str(only_bpe)), "unused")
    only_config = tmp_path / "only_config"
    only_config.mkdir()
    shutil.copy(f"{kimi_dir}/tokenizer_config.json", only_config)
    with pytest.raises(
        ValueError,
        match=r"model\.path=.*but no tiktoken\.model.*"
        r"model\.trust_remote_code",
    ):
        load_tokenizer(ModelConfig(path=str(only_config)), str(only_config))


def test_trust_remote_code_uses_the_checkpoints_tokenizer(kimi_dir, monkeypatch):
    """With trust_remote_code=true, AutoTokenizer loads the folder (its tokenization_kimi.py)."""
    import transformers

    calls = []

    class Sentinel:
        chat_template = None

    def from_pretrained(source, **kw):
        calls.append((source, kw))
        return Sentinel()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    tok = load_tokenizer(
        ModelConfig(path=kimi_dir, trust_remote_code=True, chat_template="kimi_k25.jinja"), kimi_dir
    )
    assert isinstance(tok, Sentinel) and calls == [(kimi_dir, {"trust_remote_code": True})]
    assert "<|im_middle|>" in tok.chat_template


def test_own_chat_template_file(kimi_dir, tmp_path):
    """Without model.chat_template, the folder's chat_template.jinja (how Kimi-K2.5 ships its
    template) or the config's chat_template is the tokenizer's."""
    d = tmp_path / "with_template"
    shutil.copytree(kimi_dir, d)
    tok = load_tokenizer(ModelConfig(path=str(d)), str(d))
    assert not tok.chat_template
    (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    tok = load_tokenizer(ModelConfig(path=str(d)), str(d))
    assert tok.chat_template == "{{ messages[0]['content'] }}"
    e = tmp_path / "in_config"
    write_kimi_style_tokenizer(
        e, chat_template="{{ 'x' }}", ranks=read_tiktoken_bpe(d / "tiktoken.model")
    )
    assert (
        build_kimi_tokenizer(e / "tiktoken.model", e / "tokenizer_config.json").chat_template
        == "{{ 'x' }}"
    )


def test_hub_id_from_the_cache(kimi_dir, tmp_path, monkeypatch):
    """A hub id whose repo has tiktoken.model and no tokenizer.json: its two files come through
    hf_hub_download (here from an offline cache laid out as the hub client writes it)."""
    from huggingface_hub import constants

    repo = "someorg/Kimi-Tiny"
    snap = tmp_path / "hub" / "models--someorg--Kimi-Tiny" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for name in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(f"{kimi_dir}/{name}", snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    tok = load_tokenizer(ModelConfig(path=repo), repo)
    assert tok.is_fast and tok.convert_tokens_to_ids("<|im_middle|>") == len(tok) - 256 + 17


def test_other_tokenizer_class_left_to_transformers(kimi_dir, tmp_path, monkeypatch):
    """A tiktoken.model whose config names another tokenizer class is not given Kimi's
    pattern: transformers loads it as before."""
    import transformers

    d = tmp_path / "other"
    d.mkdir()
    shutil.copy(f"{kimi_dir}/tiktoken.model", d)
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "OtherTokenizer"}))
    calls = []
    monkeypatch.setattr(
        transformers.AutoTokenizer,
        "from_pretrained",
        lambda source, **kw: calls.append(source) or object(),
    )
    load_tokenizer(ModelConfig(path=str(d)), str(d))
    assert calls == [str(d)]


def test_kimi_pattern_splits(kimi_tok):
    """Kimi's pre-tokenizer: Han runs are pieces of their own (no leading space or letters),
    digits go by three, contractions stay with their word."""
    pieces = [
        p
        for p, _ in kimi_tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(
            "abc中文def 你好 12345 it's"
        )
    ]
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decode = {c: b for b, c in bytes_to_unicode().items()}
    text = [bytes(decode[c] for c in p).decode() for p in pieces]
    assert text == ["abc", "中文", "def", " ", "你好", " ", "123", "45", " it's"]
