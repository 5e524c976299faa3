"""Small messages that must say the right thing (issue 51): a dropped field's advice under the
model's own template and under a named one; truncated samples in the end summary and in
`hsdump inspect`; `hsdump verify --complete` of a partial dataset. No engine."""

import pytest

from hsdump.config import ModelConfig
from hsdump.corpus.chat import require_template
from hsdump.corpus.formats import BadRow
from hsdump.corpus.masks import encode_conversation
from hsdump.corpus.tokenizer import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Sunny."},
]


def _advice(tok):
    with pytest.raises(BadRow) as e:
        encode_conversation(tok, require_template(tok), CHAT, TOOLS)
    assert e.value.reason == "template_drops_tools"
    return e.value.detail


def test_a_dropped_field_is_never_fixed_by_the_template_that_dropped_it(tmp_path):
    """SmolLM2's own template drops `tools` silently and no shipped template renders them for
    its tokenizer: under its own template the advice is to write one (not "e.g. the model's
    own", the one that dropped them); under a named template file, to try the model's own."""
    from hsdump.tiny import resolve_model_path

    path = resolve_model_path("smollm2:135m-instruct")
    own = _advice(load_tokenizer(ModelConfig(path=path), path))
    assert "this is the model's own template" in own and "e.g. the model's own" not in own
    mine = tmp_path / "chatml.jinja"  # ChatML without tools, as the user's own file
    mine.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    named = load_tokenizer(ModelConfig(path=path, chat_template=str(mine)), path)
    assert "e.g. the model's own: unset model.chat_template" in _advice(named)


def test_truncated_samples_are_said_in_the_summary_and_by_inspect(tmp_path, capsys):
    """A sample cut at dataset.max_seq_len shows in the end summary and in `hsdump inspect`
    (the manifest's tokenized.truncated), not only in the tokenize log line."""
    import json

    from harness import DRY, extract

    from hsdump.tools import inspect

    out = tmp_path / "ds"
    rc, log = extract(DRY, "dataset.max_samples=4", "dataset.max_seq_len=48", out=out)
    assert rc == 0, log[-3000:]
    n = json.loads((out / "manifest.json").read_text())["tokenized"]["truncated"]
    assert n >= 1, n
    assert f"samples truncated: {n} cut at dataset.max_seq_len=48" in log, log[-3000:]
    capsys.readouterr()
    assert inspect.main([str(out)]) == 0
    assert f"(truncation: truncate; {n} samples cut at it)" in capsys.readouterr().out
    assert inspect.gather(str(out))[0]["truncated"] == n
