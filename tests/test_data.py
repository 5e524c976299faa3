import datasets
import pytest

from hsdump.config import DatasetConfig, ModelConfig
from hsdump.data import load_rows, load_tokenizer, to_messages, tokenize_conversation, \
    tokenize_dataset

EOS = "<｜end▁of▁sentence｜>"
CONV = [
    {"from": "system", "value": "You are terse."},
    {"from": "human", "value": "Name a prime."},
    {"from": "gpt", "value": "Seven is prime."},
    {"from": "human", "value": "And an even one?"},
    {"from": "gpt", "value": "Two."},
]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return load_tokenizer(ModelConfig(path=tiny_llama), tiny_llama)


def runs(ids, mask):
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def test_sharegpt_and_messages_give_the_template_tokens_and_assistant_mask(tok):
    msgs = to_messages(CONV)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert to_messages([{"role": m["role"], "content": m["content"]} for m in msgs]) == msgs
    ids, mask = tokenize_conversation(tok, msgs)
    assert ids == list(tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"])
    assert len(mask) == len(ids)
    # by hand: the loss covers each assistant reply and the token that ends its turn
    assert [tok.decode(r) for r in runs(ids, mask)] == ["Seven is prime." + EOS, "Two." + EOS]
    assert ids[mask.index(1) - 1] == tok.convert_tokens_to_ids("<｜Assistant｜>")


def test_truncation_through_an_assistant_turn(tok):
    msgs = to_messages(CONV)
    ids, mask = tokenize_conversation(tok, msgs)
    cut = mask.index(1) + 2  # two tokens into the first reply
    ds = datasets.Dataset.from_list([{"conversations": CONV}])
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x", max_seq_len=cut))
    assert t.input_ids == [ids[:cut]] and t.loss_mask == [mask[:cut]] and t.truncated == 1
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x", max_seq_len=cut, truncation="skip"))
    assert t.ids == [] and t.skipped == {"too_long": 1}


BAD = [{"conversations": CONV},
       {"conversations": [{"from": "wizard", "value": "hi"}]},
       {"conversations": []},
       {"conversations": [{"from": "human", "value": None}]},
       {"conversations": [{"from": "human", "value": "only a question"}]},
       {"conversations": CONV}]


def test_bad_rows_raise_by_default_naming_row_and_fix(tok):
    ds = datasets.Dataset.from_list(BAD[:2])
    with pytest.raises(ValueError) as e:
        tokenize_dataset(ds, tok, DatasetConfig(path="x"))
    assert "dataset row 1" in str(e.value) and "unknown_role" in str(e.value)
    assert "dataset.on_bad_row=skip" in str(e.value)


def test_skipped_rows_keep_their_ids_and_are_counted(tok):
    ds = datasets.Dataset.from_list(BAD)
    t = tokenize_dataset(ds, tok, DatasetConfig(path="x", on_bad_row="skip"))
    assert t.ids == [0, 5]  # sample ids are row numbers; skipped rows keep theirs
    assert t.skipped == {"unknown_role": 1, "empty_conversation": 1, "bad_content": 1,
                         "no_assistant_tokens": 1}


def test_column_detection_and_loading(tmp_path, tok):
    p = tmp_path / "d.jsonl"
    p.write_text('{"messages": [{"role": "user", "content": "hi"}, '
                 '{"role": "assistant", "content": "hello"}]}\n')
    ds = load_rows(DatasetConfig(path=str(p)))
    t = tokenize_dataset(ds, tok, DatasetConfig(path=str(p)))
    assert t.ids == [0] and sum(t.loss_mask[0]) > 0
    both = datasets.Dataset.from_list([{"messages": [], "conversations": []}])
    with pytest.raises(ValueError, match="set dataset.column=NAME"):
        tokenize_dataset(both, tok, DatasetConfig(path="x"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_rows(DatasetConfig(path=str(tmp_path / "missing.jsonl")))


def test_shipped_tiny_chat_loads():
    ds = load_rows(DatasetConfig(path="pkg://hsdump/data/tiny_chat.jsonl"))
    assert len(ds) == 100 and "conversations" in ds.column_names
