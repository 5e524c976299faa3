"""Bad model and tokenizer paths stop the run before the engine starts, naming the key and the fix.

Before these checks a Mistral folder without tokenizer files failed inside transformers ("You
need to have sentencepiece or tiktoken installed to convert a slow tokenizer"), a Qwen2 one
loaded an empty tokenizer and every row became `template_error: 'bos_token' is undefined`, a
mistyped folder became a hub-id validation error, and a hub id without network retried for
half a minute before transformers' own message.
"""

import json
import shutil
from pathlib import Path

import harness
import pytest
from factories import compose_config

from hsdump.config import ModelConfig, register_configs, to_config
from hsdump.corpus.tokenizer import load_tokenizer
from hsdump.pipeline import run

register_configs()


def config(*overrides):
    return to_config(compose_config(*overrides))


@pytest.fixture
def no_engine(monkeypatch):
    """Any attempt to start SGLang fails the test: every refusal must come before it."""
    from hsdump.capture import engine

    def refuse(*a, **k):
        raise AssertionError("the engine was started")

    monkeypatch.setattr(engine, "CaptureEngine", refuse)


def model_folder(dest: Path, arch: str) -> Path:
    """A model folder holding only config.json (no tokenizer files), as converted checkpoints
    and weight-only uploads often are."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    cls = {
        "mistral": (MistralConfig, "MistralForCausalLM"),
        "qwen2": (Qwen2Config, "Qwen2ForCausalLM"),
        "llama": (LlamaConfig, "LlamaForCausalLM"),
    }[arch]
    c = cls[0](
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    c.architectures = [cls[1]]
    c.save_pretrained(dest)
    return dest


def extract(tmp_path, *overrides, env=None):
    """`python extract.py OVERRIDES` from the checkout (tests/harness.py, which drops the HF_*
    variables); (returncode, stdout + stderr)."""
    return harness.extract(
        f"hydra.run.dir={tmp_path}/hydra", *overrides, out=f"{tmp_path}/out", env=env
    )


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_model_folder_without_tokenizer_files(tmp_path, arch, no_engine):
    folder = model_folder(tmp_path / arch, arch)
    with pytest.raises(FileNotFoundError) as e:
        run(config(f"model.path={folder}", f"output.dir={tmp_path}/out", "progress=false"))
    msg = str(e.value)
    assert f"the model folder {folder}" in msg and "has no tokenizer files" in msg, msg
    assert "config.json" in msg  # what the folder does hold
    assert "Set model.tokenizer=" in msg, msg
    assert not (tmp_path / "out").exists()


def test_model_folder_with_a_tokenizer_elsewhere(tmp_path, tiny_llama):
    """The fix the message names works: model.tokenizer points at a folder with one."""
    folder = model_folder(tmp_path / "qwen2", "qwen2")
    m = ModelConfig(path=str(folder), tokenizer=tiny_llama, chat_template="deepseek_v3.jinja")
    tok = load_tokenizer(m, str(folder))
    assert len(tok) > 1000 and tok.chat_template.startswith("{")
    # and a tokenizer folder that has none is named as model.tokenizer
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        FileNotFoundError,
        match=r"model.tokenizer='.*empty' has no tokenizer "
        r"files.*it holds nothing",
    ):
        load_tokenizer(
            ModelConfig(path=str(folder), tokenizer=str(tmp_path / "empty")), str(folder)
        )


def test_tokenizer_that_transformers_cannot_load_names_the_key(tmp_path):
    """A folder with tokenizer files transformers cannot read (a sentencepiece model without
    the sentencepiece package) is reported against model.tokenizer, not as a bare import hint."""
    folder = model_folder(tmp_path / "mistral", "mistral")
    (folder / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(
        ValueError,
        match=r"the tokenizer of model.path=.* could not be loaded .*"
        r"set model.tokenizer",
    ):
        load_tokenizer(ModelConfig(path=str(folder)), str(folder))


@pytest.mark.parametrize("path", ["/no/such/model", "./models/my-llama", "models/meta/llama"])
def test_model_path_that_does_not_exist(tmp_path, path, no_engine):
    with pytest.raises(
        FileNotFoundError,
        match=r"model.path='.*': no such folder. Give a "
        r"Hugging Face model folder",
    ):
        run(config(f"model.path={path}", f"output.dir={tmp_path}/out"))
    assert not (tmp_path / "out").exists()


def test_model_folder_without_config_and_tokenizer_path_missing(tmp_path, tiny_llama, no_engine):
    (tmp_path / "weights").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json: not a Hugging Face model"):
        run(config(f"model.path={tmp_path}/weights", f"output.dir={tmp_path}/out"))
    with pytest.raises(FileNotFoundError, match=r"model.tokenizer='/no/tok': no such folder"):
        run(
            config(
                f"model.path={tiny_llama}", "model.tokenizer=/no/tok", f"output.dir={tmp_path}/out"
            )
        )
    # a tiny model folder less its tokenizer files
    bare = tmp_path / "bare"
    shutil.copytree(tiny_llama, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(FileNotFoundError, match="has no tokenizer files"):
        run(config(f"model.path={bare}", f"output.dir={tmp_path}/out"))


def test_hub_id_without_network(tmp_path):
    """A hub id that is not in the cache, with the hub unreachable (connection refused) or
    HF_HUB_OFFLINE set: exit 2 at once with one line that names model.path and the fix."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    env_off = {**env, "HF_HUB_OFFLINE": "1"}
    for e, want in (
        (env, "the Hugging Face hub (http://127.0.0.1:9) cannot be reached"),
        (env_off, "HF_HUB_OFFLINE is set, so it cannot be downloaded"),
    ):
        rc, out = extract(tmp_path, "model.path=example-org/no-such-model", env=e)
        assert rc == 2, out[-3000:]
        assert "model.path='example-org/no-such-model' is not a local folder" in out, out[-3000:]
        assert want in out and "hf download example-org/no-such-model --local-dir DIR" in out
        assert "engine: starting" not in out and "Traceback" not in out


def test_regenerate_on_plain_text_refused_before_tokenizing(tmp_path, monkeypatch, no_engine):
    from hsdump import pipeline

    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps({"text": f"plain words {i}"}) + "\n" for i in range(5)))

    def tokenize(*a, **k):
        raise AssertionError("the dataset was tokenized")

    monkeypatch.setattr(pipeline, "tokenize_dataset", tokenize)
    cfg = config(
        "model=tiny",
        f"dataset.path={data}",
        "regenerate=last",
        f"output.dir={tmp_path}/out",
        "progress=false",
    )
    with pytest.raises(ValueError, match="needs conversations.*regenerate.turns=none"):
        run(cfg)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- exit statuses
def test_only_refusals_exit_2(tmp_path, monkeypatch, capsys):
    """`hsdump extract` exits 2 for hsdump's refusals (a Refusal, a ValueError, names the fix)
    and only for them: a ValueError or FileNotFoundError a library raises is a failure with its
    traceback (exit 1), which `hsdump ray` retries (docs/errors.md)."""
    from hsdump import cli, pipeline
    from hsdump.errors import MissingInput, Refusal

    def raises(e):
        def run(*a, **k):
            raise e

        return run

    args = ["extract", f"output.dir={tmp_path}/out"]
    for err, rc in (
        (Refusal("dataset.max_seq_len=1: must be >= 2"), 2),
        (MissingInput("model.path='/x': no such folder"), 2),
        (ValueError("a library's own check"), 1),
        (FileNotFoundError("a library's missing file"), 1),
    ):
        monkeypatch.setattr(pipeline, "run", raises(err))
        with pytest.raises(SystemExit) as e:
            cli.main(args)
        assert e.value.code == rc, (err, e.value.code)
    assert isinstance(MissingInput("x"), FileNotFoundError)
    assert isinstance(Refusal("x"), ValueError)  # callers that catch ValueError still do


def test_a_bad_config_value_is_a_refusal():
    """The config's own checks (each group's __post_init__) are refusals, through OmegaConf."""
    from hsdump.errors import Refusal

    with pytest.raises(Refusal, match="dataset.max_seq_len=1: must be >= 2"):
        config("dataset.max_seq_len=1")
