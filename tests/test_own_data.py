"""Issue 31: a new user's own data, four silent mistakes refused (or made right). Each test
re-runs the mistake as a user makes it (engine=dry, small files in a temp folder), then checks
the behaviour, or that the refusal names the real fix."""

from __future__ import annotations

import json
import re
import sys

import datasets
import pytest
from factories import ROOT
from harness import DRY, extract, hsdump

from hsdump.config import STORAGE_DTYPES, DatasetConfig, ModelConfig
from hsdump.corpus.formats import BadRow, detect_format, to_messages
from hsdump.corpus.sources import content_fingerprint, load_rows
from hsdump.corpus.tokenization import tokenize_dataset


def chat(i: int, reply: str = "") -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"Question number {i}?"},
            {"role": "assistant", "content": reply or f"Answer number {i}."},
        ]
    }


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


ASSISTANT_FIRST = {
    "messages": [
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "Seven."},
    ]
}

# A ChatML template without {% generation %} markers that adds a default system turn when
# the conversation has none (as Qwen2.5's own does): the incremental fallback's case.
CHATML_DEFAULT_SYSTEM = (
    "{%- for m in messages %}{%- if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_resume_follows_the_files_content_not_its_path(tmp_path):
    """A: the same file by another path resumes; verify --retokenize of the unchanged file
    notes no fingerprint change; the file edited in place is refused, naming the fix."""
    data = tmp_path / "chats.jsonl"
    write_jsonl(data, [chat(i) for i in range(3)])
    out = tmp_path / "out"
    rc, log = extract(DRY, f"dataset.path={data}", "dataset.max_samples=2", out=out)
    assert rc == 0, log[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    cfg = DatasetConfig(path=str(data), max_samples=2)
    assert manifest["dataset"]["fingerprint"] == content_fingerprint(cfg, load_rows(cfg))

    rc, log = hsdump("verify", "--retokenize", str(out))
    assert rc == 0 and "2 re-tokenized" in log, log[-3000:]
    assert "fingerprint" not in log, log[-3000:]

    # the same file by a relative path from its own folder, capturing one more row
    rc, log = extract(
        DRY, "dataset.path=chats.jsonl", "dataset.max_samples=3", out=out, cwd=tmp_path
    )
    assert rc == 0, log[-3000:]
    assert "2 already committed" in log and "samples written: 1," in log, log[-3000:]

    # edited in place: a reply changed, a row added
    write_jsonl(data, [chat(0), chat(1, "A different answer."), chat(2), chat(3)])
    rc, log = extract(DRY, f"dataset.path={data}", "dataset.max_samples=4", out=out)
    assert rc == 2, log[-3000:]
    assert "cannot resume" in log and "content is not the same" in log, log[-3000:]
    assert "output.overwrite=true" in log
    assert "already committed" not in log


def test_content_fingerprint_is_the_bytes_and_the_row_selection(tmp_path, monkeypatch):
    """A, in process: by absolute or relative path, or a copy elsewhere, the same value;
    another max_samples too; an edit, or another split/column/format, another value."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rows = [chat(i) for i in range(4)]
    write_jsonl(tmp_path / "a" / "c.jsonl", rows)
    write_jsonl(tmp_path / "b" / "c.jsonl", rows)
    monkeypatch.chdir(tmp_path)

    def fp(path, **kw):
        cfg = DatasetConfig(path=path, cache=False, **kw)
        return content_fingerprint(cfg, load_rows(cfg))

    same = fp(str(tmp_path / "a" / "c.jsonl"))
    assert same.startswith("sha256:")
    assert fp("a/c.jsonl") == fp("b/c.jsonl") == fp("a/c.jsonl", max_samples=2) == same
    assert fp("a", split="train") == fp("b", split="train") != same  # folders: their files
    assert fp("a/c.jsonl", format="messages") != same
    write_jsonl(tmp_path / "b" / "c.jsonl", rows + [chat(9)])
    assert fp("b/c.jsonl") != same and fp("b") != fp("a")


def test_a_named_format_the_rows_are_not_in_names_dataset_format_messages(tmp_path):
    """B: dataset.format=sharegpt on a messages file used to advise dataset.column=NAME, and
    following that gave bad_turn ... on_bad_row=skip; now both name dataset.format=messages."""
    data = tmp_path / "msgs.jsonl"
    write_jsonl(data, [chat(i) for i in range(3)])
    rc, log = extract(DRY, f"dataset.path={data}", "dataset.format=sharegpt", out=tmp_path / "o")
    assert rc == 2, log[-3000:]
    assert "dataset.format=messages" in log and "unset" in log, log[-3000:]
    assert log.index("dataset.format=messages") < log.index("dataset.column=NAME")  # first

    ds = load_rows(DatasetConfig(path=str(data)))
    with pytest.raises(ValueError, match="set dataset.format=messages"):  # the old advice
        detect_format(ds, DatasetConfig(path=str(data), format="sharegpt", column="messages"))
    assert detect_format(ds, DatasetConfig(path=str(data))) == ("messages", "messages")
    with pytest.raises(BadRow, match="dataset.format=messages") as e:  # a turn past the peek
        to_messages([{"role": "user", "content": "hi"}], "sharegpt")
    assert e.value.reason == "bad_turn"
    sharegpt = tmp_path / "sg.jsonl"
    write_jsonl(sharegpt, [{"conversations": [{"from": "human", "value": "hi"}]}])
    with pytest.raises(ValueError, match="set dataset.format=sharegpt"):
        detect_format(
            load_rows(DatasetConfig(path=str(sharegpt))), DatasetConfig("x", format="messages")
        )


def test_a_folder_of_mixed_file_kinds_is_refused_naming_them(tmp_path):
    """B: a folder of a .jsonl and a .parquet file (or .json and .csv) gave datasets'
    'An error occurred' with no cause (or read one kind only); now refused before loading."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "a.jsonl", [chat(0)])
    datasets.Dataset.from_list([chat(1)]).to_parquet(str(mixed / "b.parquet"))
    rc, log = extract(DRY, f"dataset.path={mixed}", out=tmp_path / "o")
    assert rc == 2, log[-3000:]
    assert "a.jsonl" in log and "b.parquet" in log and "one kind" in log, log[-3000:]
    assert f"dataset.path={mixed}/a.jsonl" in log
    assert "DatasetGenerationError" not in log

    other = tmp_path / "other"
    other.mkdir()
    (other / "a.json").write_text(json.dumps([chat(0)]))
    (other / "b.csv").write_text("text\nhello\n")
    (other / "README.md").write_text("# not data\n")
    with pytest.raises(ValueError, match=r"csv \(b.csv\); json \(a.json\)"):
        load_rows(DatasetConfig(path=str(other)))
    (other / "b.csv").unlink()
    assert len(load_rows(DatasetConfig(path=str(other)))) == 1  # one kind (README.md is no data)


def test_a_conversation_opening_with_the_assistant_is_its_own_bad_row(tmp_path, tiny_llama):
    """B: counted as starts_with_assistant (not template_not_incremental) with advice that
    fits, under the tiny default's DeepSeek template and under ChatML templates."""
    data = tmp_path / "d.jsonl"
    write_jsonl(data, [chat(0), ASSISTANT_FIRST, chat(2)])
    rc, log = extract(DRY, f"dataset.path={data}", "dataset.on_bad_row=skip", out=tmp_path / "o")
    assert rc == 0, log[-3000:]
    assert re.search(r"samples skipped: 1 \(starts_with_assistant[=:] ?1\)", log), log[-3000:]

    from hsdump.corpus.chat import template_path
    from hsdump.corpus.tokenizer import load_tokenizer

    tok = load_tokenizer(ModelConfig(path=tiny_llama), tiny_llama)
    for template in ("deepseek_v3.jinja", "qwen3.jinja", CHATML_DEFAULT_SYSTEM):
        tok.chat_template = template if "{" in template else template_path(template).read_text()
        cfg = DatasetConfig(path=str(data), cache=False, on_bad_row="skip")
        t = tokenize_dataset(load_rows(cfg), tok, cfg, progress=False)
        assert t.ids == [0, 2] and t.skipped == {"starts_with_assistant": 1}, template
        cfg = DatasetConfig(path=str(data), cache=False)
        with pytest.raises(ValueError) as e:
            tokenize_dataset(load_rows(cfg), tok, cfg, progress=False)
        msg = str(e.value)
        assert "starts_with_assistant" in msg and "drop the leading assistant turn" in msg
        assert "add the user turn it answered" in msg and "generation" not in msg


def test_hydra_usage_errors_exit_2_and_a_crash_in_the_task_exits_1(tmp_path):
    """C: Hydra's own refusals (an unknown key, a config group choice that does not exist)
    exit 2 as docs/errors.md says, for extract.py and `hsdump extract`; an unexpected error
    inside the task keeps Hydra's 1."""
    rc, log = extract(DRY, "nosuchkey=1", out=tmp_path / "o")
    assert rc == 2 and "nosuchkey" in log, log[-3000:]
    rc, log = hsdump("extract", "model=nosuch", f"output.dir={tmp_path / 'o'}", cwd=tmp_path)
    assert rc == 2 and "nosuch" in log, log[-3000:]

    from hydra.errors import ConfigCompositionException

    from hsdump.cli import run_app

    def hydra_like(exc):  # what Hydra's run_and_report does with an error: print, exit 1
        def app():
            try:
                raise exc
            except Exception:
                sys.exit(1)

        return app

    with pytest.raises(SystemExit) as e:
        run_app(hydra_like(ConfigCompositionException("Could not override 'x'")))
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        run_app(hydra_like(RuntimeError("a bug")))
    assert e.value.code == 1


def test_docs_list_the_storage_dtypes_the_code_takes():
    """C: docs/running.md named `bf16`, which output.dtype refuses."""
    text = (ROOT / "docs" / "running.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `output` |"))
    assert "bf16`" not in row
    assert all(f"`{d}`" in row for d in STORAGE_DTYPES), row
    assert re.search(r"exit status 2", (ROOT / "docs" / "running.md").read_text())
