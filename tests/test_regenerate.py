"""`regenerate.turns`: the target model rewrites the answers, then hsdump captures the rewritten
conversations (tiny Llama, DeepSeek tokenizer and template). Regeneration's bookkeeping
(windows, skips after regeneration, resume, stored conversations, token_freq.json) runs on the
dry engine (tests/harness.py's DRY: deterministic short answers, rows a function of the ids);
the model's own answers and the fidelity of their rows need the real CPU engine: one
module-scoped run (`regenerated`), read by the tests marked `engine`."""

import functools
import signal
from collections import Counter

import pytest
import torch
from factories import ROOT, compose_config, hf_hidden_states
from harness import DRY, extract
from tolerance import per_sample_ok, rel_err

from hsdump.config import DatasetConfig, RegenerateConfig, register_configs, to_config
from hsdump.corpus.regenerate import regenerate, stop_token_ids, to_sample, turns_to_rewrite
from hsdump.store.reader import HsdumpDataset
from hsdump.store.stats import COMMITTED, read_token_freq

ARGS = [
    "dataset.max_samples=5",
    "regenerate.max_new_tokens=16",
    "dataset.max_seq_len=512",
    "output.shard_bytes=30000",
]
DRY_ARGS = [*ARGS, DRY]


def dry_dataset(path):
    return HsdumpDataset(str(path), allow_dry=True)


@functools.lru_cache(maxsize=None)
def tokenizer():
    """The embedded default's tokenizer and chat template (conf/model/tiny.yaml, its preset's
    template resolved as extract.py resolves it); loaded once per test process (the tests only
    read it)."""
    from hsdump.corpus.tokenizer import load_tokenizer
    from hsdump.tiny import resolve_model_path

    register_configs()
    cfg = to_config(compose_config()).model
    return load_tokenizer(cfg, resolve_model_path(cfg.path))


def source_rows(n):
    from hsdump.corpus.sources import load_rows

    return load_rows(
        DatasetConfig(path=str(ROOT / "hsdump/corpus/data/tiny_chat.jsonl"), max_samples=n)
    )


def check_stored_conversations(ds, tok, rows):
    """Each sample's ids and mask are the template applied to its stored (regenerated)
    conversation, whose answers all replaced the source's; yields (sid, record, ids)."""
    from hsdump.corpus.formats import dataset_record, row_to_sample
    from hsdump.corpus.masks import tokenize_conversation

    differs = 0
    for sid in ds.ids:
        rec, conv = ds.get(sid), ds.conversation(sid)
        ids, mask = rec["input_ids"].tolist(), rec["loss_mask"].tolist()
        # exactly the template applied to the stored (regenerated) conversation
        assert (ids, mask) == tokenize_conversation(tok, conv)
        # the source conversation's own answers were replaced, every one of them
        src, _ = row_to_sample(dataset_record(rows[sid]), "sharegpt", "conversations")
        assert [m["role"] for m in conv] == [m["role"] for m in src]
        assert all(
            a["content"] != b["content"] for a, b in zip(conv, src) if a["role"] == "assistant"
        )
        differs += ids != tokenize_conversation(tok, src)[0]
        # hand-checked spans: each run of 1s is one assistant answer plus the end of turn
        runs, cur = [], []
        for t, m in zip(ids + [None], mask + [0]):
            if m:
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        answers = [m["content"] for m in conv if m["role"] == "assistant"]
        assert len(runs) == len(answers)
        eos = tok.eos_token
        for run, answer in zip(runs, answers):
            assert tok.decode(run) == answer + eos, (tok.decode(run), answer)
        yield sid, rec, ids
    assert differs == len(ds)  # the ids are not the source conversations' tokenization


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory, tiny_llama):
    """One real-engine run of regenerate.turns=all (only tests marked `engine` use it)."""
    out = tmp_path_factory.mktemp("regen") / "ds"
    rc, log = extract("regenerate.turns=all", out=out, args=ARGS, timeout=900)
    assert rc == 0, log[-3000:]
    return out, log


@pytest.fixture(scope="module")
def regenerated_dry(tmp_path_factory):
    """The same run on the dry engine: the reference of the bookkeeping tests."""
    out = tmp_path_factory.mktemp("regen_dry") / "ds"
    rc, log = extract("regenerate.turns=all", out=out, args=DRY_ARGS)
    assert rc == 0, log[-3000:]
    return out, log


# real engine: the answers are the model's own generated tokens, and their rows are compared
# with a transformers forward pass
@pytest.mark.engine
def test_ids_masks_and_states_are_those_of_the_stored_conversation(regenerated, tiny_llama):
    out, log = regenerated
    assert "regenerated:" in log and "tokens generated" in log
    tok = tokenizer()
    ds = HsdumpDataset(str(out))
    assert len(ds) == 5
    for sid, rec, ids in check_stored_conversations(ds, tok, source_rows(5)):
        # hidden states: a transformers forward pass of the stored ids
        ref = hf_hidden_states(tiny_llama, ids)
        ref16 = hf_hidden_states(tiny_llama, ids, torch.bfloat16)
        for h, k in zip(rec["hidden_states"], ds.layers):
            assert per_sample_ok(rel_err(h, ref[k]), rel_err(ref16[k], ref[k])), (sid, k)


def test_ids_masks_and_token_freq_are_those_of_the_stored_conversation(regenerated_dry):
    """The bookkeeping half of the test above (split from it), on the dry engine: ids, masks
    and spans follow the stored conversation, and token_freq.json counts its tokens."""
    out, log = regenerated_dry
    assert "regenerated:" in log and "tokens generated" in log
    tok = tokenizer()
    ds = dry_dataset(out)
    assert len(ds) == 5
    for sid, _, _ in check_stored_conversations(ds, tok, source_rows(5)):
        answers = [m["content"] for m in ds.conversation(sid) if m["role"] == "assistant"]
        assert all(a.startswith("dry ") for a in answers)  # the dry engine's answers
    # token_freq.json counts the stored (regenerated) tokens, not the source's
    want = Counter()
    for sid in ds.ids:
        rec = ds.get(sid, hidden=False)
        want.update(rec["input_ids"][rec["loss_mask"].bool()].tolist())
    counts, meta = read_token_freq(str(out))
    assert counts == dict(want) and meta["counted"] == COMMITTED and meta["samples"] == 5


def test_greedy_regeneration_is_the_same_across_a_kill_and_resume(regenerated_dry, tmp_path):
    ref, _ = regenerated_dry
    out = tmp_path / "ds"
    # killed at its 3rd captured sample (the 1st fills a shard of its own, the 2nd is staged in
    # the next one, lost), then resumed; paced (a real engine's generation takes time too) so
    # that the writer's thread has committed the 1st shard when the kill lands
    pace = "engine.dry_tokens_per_s=2000"
    rc, log = extract(
        "regenerate.turns=all",
        "regenerate.window=2",
        pace,
        out=out,
        args=DRY_ARGS,
        fault="sample@3",
    )
    assert rc == -signal.SIGKILL, log[-2000:]
    partial = dry_dataset(out)
    assert 0 < len(partial) < 5
    rc, log = extract("regenerate.turns=all", "regenerate.window=2", out=out, args=DRY_ARGS)
    assert rc == 0, log[-3000:]
    assert f"already committed before this run: {len(partial)}" in log
    a, b = dry_dataset(ref), dry_dataset(out)
    assert a.ids == b.ids
    # counted over all 5, not the resumed run's
    assert read_token_freq(str(out)) == read_token_freq(str(ref))
    for sid in a.ids:
        assert a.conversation(sid) == b.conversation(sid)
        assert torch.equal(a.get(sid)["input_ids"], b.get(sid)["input_ids"])
        assert torch.equal(a.get(sid)["loss_mask"], b.get(sid)["loss_mask"])
    # the turns policy is part of the resume key: another one is refused, and named
    rc, log = extract("regenerate.turns=last", out=out, args=DRY_ARGS)
    assert rc == 2 and "regenerate:" in log and "'turns': 'all'" in log, log[-2000:]
    rc, log = extract(out=out, args=DRY_ARGS)  # nor can the dataset's own answers be mixed in
    assert rc == 2 and "regenerate:" in log, log[-2000:]


def test_last_turn_and_truncation(tmp_path):
    out = tmp_path / "ds"
    rc, log = extract(
        "regenerate.turns=last",
        "dataset.max_seq_len=48",
        "regenerate.max_new_tokens=24",
        out=out,
        args=DRY_ARGS,
    )
    assert rc == 0, log[-3000:]
    tok = tokenizer()
    from hsdump.corpus.masks import tokenize_conversation

    ds = dry_dataset(out)
    assert len(ds) > 0
    cut = 0
    for sid in ds.ids:
        conv = ds.conversation(sid)
        assert conv[-1]["role"] == "assistant"  # turns after the last answer are dropped
        ids, mask = tokenize_conversation(tok, conv)
        rec = ds.get(sid)
        assert rec["input_ids"].tolist() == ids[:48] and rec["loss_mask"].tolist() == mask[:48]
        cut += len(ids) > 48
    assert cut > 0  # some were truncated to max_seq_len


def test_a_rewrite_too_long_for_the_policy_is_recorded_as_skipped(tmp_path):
    """truncation=skip: a conversation that fits as written but not once its last answer is
    regenerated is recorded as skipped, never captured, and a resumed run does not generate
    it again. (The dry engine answers in at most 12 words, so a rewrite grows only where the
    source's last answer was shorter: among the first 20 rows, row 6's ("Iphone 14 pro max")
    fits in 200 tokens as written and not once rewritten.)"""
    out = tmp_path / "ds"
    policy = [
        "dataset.max_samples=20",
        "regenerate.turns=last",
        "dataset.truncation=skip",
        "dataset.max_seq_len=200",
        "regenerate.max_new_tokens=96",
    ]
    rc, log = extract(*policy, out=out, args=DRY_ARGS)
    assert rc == 0, log[-3000:]
    ds = dry_dataset(out)
    after = {int(k) for k, why in ds.skipped.items() if why == "too_long after regeneration"}
    assert after and not after & set(ds.ids), (ds.skipped, log[-2000:])
    assert ds.ids  # and the others that fit were captured
    assert "too_long after regeneration" in log
    # resumed: nothing left, nothing generated again
    rc, log = extract(*policy, out=out, args=DRY_ARGS)
    assert rc == 0 and "regenerated:" not in log, log[-2000:]
    assert f"already committed before this run: {len(ds.ids) + len(after)}" in log
    assert dry_dataset(out).ids == ds.ids


def test_an_empty_or_immediately_stopped_answer():
    """The model's first token ends its turn: the answer is empty, the sample still holds the
    end-of-turn token in the loss (what the drafter must learn to predict there)."""
    tok = tokenizer()
    from hsdump.corpus.chat import chat_template_of

    template = chat_template_of(tok)
    stop = stop_token_ids(tok)
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "old"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "old 2"},
    ]
    seen = []

    def generate(reqs):  # the engine's answer: its stop token at once, then nothing at all
        seen.extend(reqs)
        return {
            key: {"output_ids": [stop[0]] if key[1] == 1 else [], "text": ""} for key, _, _ in reqs
        }

    new = regenerate([(7, msgs, None)], tok, template, RegenerateConfig(turns="all"), generate)
    assert [m["content"] for m in new[7]] == ["hi", "", "again", ""]
    assert [key for key, _, _ in seen] == [(7, 1), (7, 3)]  # in order, one round each
    # round 2's prompt holds round 1's (empty) answer, not the source's
    from hsdump.corpus.regenerate import prompt_ids

    assert seen[1][1] == prompt_ids(tok, template, new[7][:3])
    ids, mask = to_sample(tok, template, new[7], None, DatasetConfig(path="x"))
    assert sum(mask) == 2 and tok.decode([t for t, m in zip(ids, mask) if m]) == tok.eos_token * 2
    # temperature 0 sends no seed; sampling sends one per (sample, turn)
    assert "sampling_seed" not in seen[0][2]
    from hsdump.corpus.regenerate import sampling_params

    a = sampling_params(RegenerateConfig(turns="all", temperature=0.7, seed=1), stop, 7, 1)
    b = sampling_params(RegenerateConfig(turns="all", temperature=0.7, seed=1), stop, 7, 3)
    assert a["sampling_seed"] != b["sampling_seed"] and a["stop_token_ids"] == stop


def test_which_turns_and_config_errors():
    m = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a", "tool_calls": [{"function": {"name": "f"}}]},
        {"role": "tool", "content": "r"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "c"},
    ]
    assert turns_to_rewrite(m, "all") == [4, 6]  # a tool-calling turn is kept as written
    assert turns_to_rewrite(m, "last") == [6] and turns_to_rewrite(m, "none") == []
    with pytest.raises(ValueError, match="regenerate.turns='some'"):
        RegenerateConfig(turns="some")
    with pytest.raises(ValueError, match="reasoning"):
        RegenerateConfig(reasoning="maybe")
    from hsdump.corpus.regenerate import clean

    assert clean("<think>x\ny</think>\n\nanswer", "drop") == "answer"
    assert clean("<think>x</think>answer", "keep") == "<think>x</think>answer"


def test_two_jobs_count_token_freq_once_when_the_dataset_is_complete(regenerated_dry, tmp_path):
    """dist.num_jobs=2: the first job to end leaves token_freq.json uncounted (the other's
    samples are not committed yet); the second counts the whole dataset, as one job would."""
    ref, _ = regenerated_dry
    out = tmp_path / "ds"
    rc, log = extract(
        "regenerate.turns=all", "dist.num_jobs=2", "dist.job_index=0", out=out, args=DRY_ARGS
    )
    assert rc == 0, log[-3000:]
    assert "token_freq.json: not counted yet" in log, log[-3000:]
    assert not (out / "token_freq.json").exists()
    rc, log = extract(
        "regenerate.turns=all", "dist.num_jobs=2", "dist.job_index=1", out=out, args=DRY_ARGS
    )
    assert rc == 0, log[-3000:]
    assert "token_freq.json: counted over the committed samples" in log, log[-3000:]
    assert dry_dataset(out).ids == dry_dataset(ref).ids
    assert read_token_freq(str(out)) == read_token_freq(str(ref))
