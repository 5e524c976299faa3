"""`python -m hsdump preview`: rendered samples with the loss-masked tokens marked."""

import re

import harness

from hsdump.tools.preview import groups
from hsdump.tools.preview import main as preview_main


def test_groups():
    assert groups([1, 2, 3, 4], [0, 1, 1, 0]) == [(0, 1, False), (1, 3, True), (3, 4, False)]
    assert groups([], []) == []


def test_preview_marks_assistant_text(capsys):
    assert preview_main(["-n", "2", "--color", "never", "dataset.max_seq_len=2048"]) == 0
    out = capsys.readouterr().out
    assert "template deepseek_v3.jinja" in out and "{% generation %} markers" in out
    assert out.count("── row ") == 2
    body = out.split("── row ", 1)[1]  # past the legend, which shows the brackets too
    marked = re.findall(r"\[\[(.*?)\]\]", body, flags=re.S)
    # the first reply of row 0 of tiny_chat, and the turn-ending token, are in the loss
    assert marked[0].startswith("Here are the main ideas of Jeff Walker")
    assert all(m.endswith("<｜end▁of▁sentence｜>") for m in marked)
    assert "[[<｜Assistant｜>" not in out and "<｜Assistant｜>[[" in out


def test_preview_color_and_skipped_rows(tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text(
        '{"messages": [{"role": "user", "content": "hi"}]}\n'
        '{"messages": [{"role": "user", "content": "hi"}, '
        '{"role": "assistant", "content": "hello"}]}\n'
    )
    assert preview_main([f"dataset.path={p}", "--color", "always"]) == 0
    out = capsys.readouterr().out
    assert "row 0: skipped (no_assistant_tokens)" in out
    assert "\x1b[32mhello<｜end▁of▁sentence｜>\x1b[0m" in out


def test_preview_errors_and_cli(tmp_path):
    missing = f"dataset.path={tmp_path / 'missing.jsonl'}"
    rc, out, err = harness.python("-m", "hsdump", "preview", "-n", "1", missing, split=True)
    assert rc == 2 and "no such file" in err, (out, err)
    template = "model.chat_template=qwen3_nothink.jinja"
    rc, out, err = harness.python(
        "-m", "hsdump", "preview", "-n", "1", "--max-tokens", "30", template, split=True
    )
    assert rc == 0, err
    assert "qwen3_nothink.jinja" in out and "more tokens" in out
