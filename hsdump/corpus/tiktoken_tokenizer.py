"""Kimi's tokenizer as a fast (Rust) tokenizer, built from its files without running its code.

Kimi-K2 / Kimi-K2.5 ship `tiktoken.model` (the byte-level BPE: one `base64(token) rank` per
line), `tokenizer_config.json` (the added tokens and their ids, bos/eos) and
`tokenization_kimi.py`, the Python class `TikTokenTokenizer` that ties them together and that
transformers runs only with trust_remote_code. `build_kimi_tokenizer` builds the same tokenizer
from the two data files with transformers' own tiktoken converter (`TikTokenConverter`, fed by
a reader of the file here, so the `tiktoken` package is not needed):

- BPE by rank over the bytes of each pre-token, a pre-token that is a whole vocabulary entry
  taken as is (tiktoken's rule; `ignore_merges`);
- the pre-tokenizer regex `KIMI_PATTERN`, Kimi's `TikTokenTokenizer.pat_str`;
- ids `len(ranks) .. len(ranks) + 255` (`num_reserved_special_tokens = 256`) are added tokens:
  the ones `added_tokens_decoder` names with their names and `special` flags, the others
  `<|reserved_token_ID|>`, all matched in text before the BPE as Kimi's does (it encodes with
  tiktoken's `allowed_special="all"`);
- bos `[BOS]` and eos `[EOS]` unless the config names others, and nothing added around the
  text (Kimi's class adds no bos either).

`write_kimi_style_tokenizer` writes a small tokenizer folder in the same layout (a vocabulary
learned from English and Chinese text, Kimi's special-token ids and names), for tests and tiny
checkpoints.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from hsdump.errors import Refusal

TIKTOKEN_FILE = "tiktoken.model"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
NUM_RESERVED_SPECIAL_TOKENS = 256
"""Kimi's `TikTokenTokenizer.num_reserved_special_tokens`: the ids after the BPE ranks."""

# Kimi's pre-tokenizer split regex, `TikTokenTokenizer.pat_str` of moonshotai's
# tokenization_kimi.py (Kimi-K2-Instruct, Kimi-K2.5), copied from public copies of that file:
# github.com/troy12x/quasar-kimi/blob/main/tokenization_kimi.py (a Kimi-K2 copy) and
# github.com/PabloRaka/bear/blob/main/tokenization_kimi.py (a later Kimi copy), identical; the
# same string is the pat_str of Baseten's basetenkenizer tests for Kimi's tokenizers. Runs of Han
# characters are pieces of their own; the letter classes exclude Han (`&&[^\p{Han}]`, class
# intersection, read alike by tiktoken's regex engine and by the Oniguruma of `tokenizers`).
KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

KIMI_DEFAULT_EXTRA_SPECIAL = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
]
"""`additional_special_tokens` of Kimi's class when its config gives none."""

KIMI_SPECIAL_LAYOUT: Dict[int, Tuple[str, bool]] = {
    0: ("[BOS]", True),
    1: ("[EOS]", True),
    2: ("<|im_end|>", True),
    3: ("<|im_user|>", True),
    4: ("<|im_assistant|>", True),
    6: ("<|start_header_id|>", True),
    7: ("<|end_header_id|>", True),
    9: ("[EOT]", True),
    10: ("<|im_system|>", True),
    11: ("<|tool_calls_section_begin|>", False),
    12: ("<|tool_calls_section_end|>", False),
    13: ("<|tool_call_begin|>", False),
    14: ("<|tool_call_argument_begin|>", False),
    15: ("<|tool_call_end|>", False),
    17: ("<|im_middle|>", True),
    18: ("<|media_begin|>", True),
    19: ("<|media_content|>", True),
    20: ("<|media_end|>", True),
    21: ("<|media_pad|>", True),
    22: ("<think>", False),
    23: ("</think>", False),
    254: ("[UNK]", True),
    255: ("[PAD]", True),
}
"""Kimi-K2.5's added tokens as (name, special) by offset from the first id after the ranks
(163584 in the real one: [BOS] 163584, <|im_end|> 163586, <|im_middle|> 163601, <think>
163606, [PAD] 163839); the other offsets are `<|reserved_token_ID|>`. Used by
`write_kimi_style_tokenizer` only (the builder reads the names from the config); the media
markers' offsets (18-21) are from memory, not checked against the real file."""


# ---- the tiktoken file -----------------------------------------------------------------------


def read_tiktoken_bpe(path: Union[str, Path]) -> Dict[bytes, int]:
    """The ranks of a tiktoken BPE file: one `base64(token) rank` per line."""
    ranks: Dict[bytes, int] = {}
    for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:
            raise Refusal(
                f"{path}:{n}: not a tiktoken BPE line (`base64 rank`): {line[:80]!r}"
            ) from e
    return ranks


def write_tiktoken_bpe(path: Union[str, Path], ranks: Dict[bytes, int]) -> None:
    """Write `ranks` as a tiktoken BPE file (by rank)."""
    lines = [
        f"{base64.b64encode(t).decode()} {r}\n"
        for t, r in sorted(ranks.items(), key=lambda x: x[1])
    ]
    Path(path).write_text("".join(lines))


# ---- building the fast tokenizer -------------------------------------------------------------


def _token_content(value) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get("content")
    return str(value)


def kimi_added_tokens(config: dict, num_base: int) -> List[Tuple[int, str, bool]]:
    """(id, content, special) of the added tokens, in id order: ids `num_base ..
    num_base + 255` (and any later id the config names), named by `added_tokens_decoder`,
    else `<|reserved_token_ID|>` (special), as Kimi's `TikTokenTokenizer` does."""
    named: Dict[int, Tuple[str, bool]] = {}
    for key, tok in (config.get("added_tokens_decoder") or {}).items():
        i = int(key)
        content = _token_content(tok)
        special = bool(tok.get("special", True)) if isinstance(tok, dict) else True
        if i < num_base:
            raise Refusal(
                f"{CONFIG_FILE}: added token {content!r} has id {i}, inside the "
                f"{num_base} ranks of {TIKTOKEN_FILE}; Kimi's layout numbers them "
                "after the ranks"
            )
        named[i] = (content, special)
    end = max([num_base + NUM_RESERVED_SPECIAL_TOKENS - 1, *named]) + 1
    return [(i, *named.get(i, (f"<|reserved_token_{i}|>", True))) for i in range(num_base, end)]


def build_kimi_tokenizer(
    tiktoken_file: Union[str, Path],
    config_file: Union[str, Path],
    chat_template: Optional[str] = None,
):
    """A `PreTrainedTokenizerFast` that tokenizes like Kimi's `TikTokenTokenizer` does with
    these files. `chat_template`: the template to attach; else the config's own, if any."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    config = json.loads(Path(config_file).read_text())
    ranks = read_tiktoken_bpe(tiktoken_file)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise Refusal(f"{tiktoken_file}: the ranks are not 0..{len(ranks) - 1} without gaps")

    class Converter(TikTokenConverter):
        # transformers' converter reads the file with the `tiktoken` package; same result here
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url):
            return ranks

    backend = Converter(vocab_file=str(tiktoken_file), pattern=KIMI_PATTERN).converted()
    added = kimi_added_tokens(config, len(ranks))
    for i, content, special in added:  # one at a time, in id order: each takes the next id
        backend.add_tokens([AddedToken(content, special=special, normalized=False)])
        got = backend.token_to_id(content)
        if got != i:
            raise Refusal(
                f"{config_file}: added token {content!r} should have id {i}, "
                f"got {got} (a duplicate name?)"
            )

    contents = {c for _, c, _ in added}
    kw = {}
    for key, default in (
        ("bos_token", "[BOS]"),
        ("eos_token", "[EOS]"),
        ("unk_token", None),
        ("pad_token", None),
    ):
        value = _token_content(config.get(key, default))
        if value is not None:
            if value not in contents:
                raise Refusal(f"{config_file}: {key}={value!r} is not one of its added tokens")
            kw[key] = value
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens")
    if extra is None:
        extra = KIMI_DEFAULT_EXTRA_SPECIAL
    if isinstance(extra, dict):
        extra = list(extra.values())
    kw["extra_special_tokens"] = [t for t in map(_token_content, extra) if t in contents]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        clean_up_tokenization_spaces=False,
        model_max_length=int(config.get("model_max_length", 1 << 60)),
        **kw,
    )
    template = chat_template or config.get("chat_template")
    if template:
        tok.chat_template = template
    return tok


# ---- finding the files (hsdump.corpus.tokenizer.load_tokenizer) -------------------------------------

TiktokenFiles = Tuple[str, str, Optional[str]]
"""(tiktoken.model, tokenizer_config.json, chat_template.jinja or None) paths."""


def _missing(key: str, source: str, have: str, lacks: str) -> ValueError:
    return ValueError(
        f"{key}={source!r} has {have} but no {lacks}: a tokenizer in Kimi's layout is built "
        f"from {TIKTOKEN_FILE} and {CONFIG_FILE} together (model.trust_remote_code=false). Add "
        f"{lacks}, set model.tokenizer to a folder or hub id with both (or with a "
        "tokenizer.json), or set model.trust_remote_code=true to run the checkpoint's own "
        "tokenizer code"
    )


def _names_tiktoken_class(config_path: Path, default: bool = False) -> bool:
    """The config names Kimi's tokenizer class (directly or through auto_map); `default` when
    it names no tokenizer class at all."""
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return default
    auto = json.dumps(config.get("auto_map") or {})
    if config.get("tokenizer_class") == "TikTokenTokenizer" or "TikTokenTokenizer" in auto:
        return True
    return default and not config.get("tokenizer_class") and not config.get("auto_map")


def local_tiktoken_files(source: str, key: str) -> Optional[TiktokenFiles]:
    """The files of a local folder in Kimi's layout (tiktoken.model, no tokenizer.json, a
    tokenizer_config.json naming Kimi's TikTokenTokenizer or no tokenizer class), or None when
    `source` is not such a folder. A ValueError naming `key` when one of the two
    files is missing (a config that names Kimi's TikTokenTokenizer without tiktoken.model)."""
    p = Path(source).expanduser()
    if not p.is_dir() or (p / "tokenizer.json").is_file():
        return None
    bpe, config, template = p / TIKTOKEN_FILE, p / CONFIG_FILE, p / TEMPLATE_FILE
    if bpe.is_file():
        if not config.is_file():
            raise _missing(key, source, TIKTOKEN_FILE, CONFIG_FILE)
        if not _names_tiktoken_class(config, default=True):
            return None  # another tokenizer class with a tiktoken.model: transformers' to load
        return str(bpe), str(config), str(template) if template.is_file() else None
    if config.is_file() and _names_tiktoken_class(config):
        raise _missing(
            key, source, f"{CONFIG_FILE} (tokenizer_class TikTokenTokenizer)", TIKTOKEN_FILE
        )
    return None


def hub_tiktoken_files(source: str, key: str) -> Optional[TiktokenFiles]:
    """Like `local_tiktoken_files` for a hub id: tiktoken.model and tokenizer_config.json
    downloaded (or taken from the cache) when the repo has tiktoken.model and no
    tokenizer.json; None for a local path or a repo with a tokenizer.json."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HFValidationError

    if Path(source).expanduser().exists():
        return None

    def get(filename: str) -> Optional[str]:
        try:
            return hf_hub_download(source, filename)
        except EntryNotFoundError:  # not in the repo (or, offline, not in the cache)
            return None

    try:
        if get("tokenizer.json") is not None:
            return None
    except HFValidationError:
        return None  # not a hub id: AutoTokenizer reports it
    bpe, config = get(TIKTOKEN_FILE), get(CONFIG_FILE)
    if bpe is None:
        if config is not None and _names_tiktoken_class(Path(config)):
            raise _missing(
                key, source, f"{CONFIG_FILE} (tokenizer_class TikTokenTokenizer)", TIKTOKEN_FILE
            )
        return None
    if config is None:
        raise _missing(key, source, TIKTOKEN_FILE, CONFIG_FILE)
    if not _names_tiktoken_class(Path(config), default=True):
        return None
    return bpe, config, get(TEMPLATE_FILE)


def load_tiktoken_tokenizer(files: TiktokenFiles, template: Optional[str], source: str, key: str):
    """`build_kimi_tokenizer` on `files`, with `template` (else the folder's own
    chat_template.jinja, else the config's); a ValueError naming `key` when it fails."""
    bpe, config, own_template = files
    if template is None and own_template is not None:
        template = Path(own_template).read_text()
    try:
        return build_kimi_tokenizer(bpe, config, chat_template=template)
    except (OSError, ValueError, KeyError) as e:
        raise Refusal(
            f"the tokenizer of {key}={source!r} ({TIKTOKEN_FILE} and {CONFIG_FILE}, "
            f"Kimi's layout) could not be built ({type(e).__name__}: {e}); fix "
            "those files, or set model.trust_remote_code=true to run the "
            "checkpoint's own tokenizer code"
        ) from e


# ---- a small tokenizer in Kimi's layout ------------------------------------------------------

_HAN_WORDS = (
    "我们 你们 他们 这个 那个 什么 为什么 怎么 可以 没有 知道 时间 问题 工作 学习 中国 世界 "
    "今天 明天 昨天 现在 已经 因为 所以 但是 如果 虽然 还是 或者 非常 一些 一下 自己 朋友 "
    "老师 学生 电脑 手机 程序 代码 数据 模型 语言 文字 计算 函数 变量 训练 推理 答案 例子 "
    "方法 结果 系统 网络 文件 用户 助手 请问 谢谢 你好 再见 天气 城市 北京 上海 历史 文化 "
    "科学 数学 物理 化学 音乐 电影 书籍 故事 简单 复杂 重要 需要 帮助 解释 说明 翻译 总结"
).split()
_HAN_PUNCT = ("，", "。", "？", "！", "：", "；", "、")
_HAN_TEXT = (
    "你好！我是一个人工智能助手，可以帮助你回答问题、写代码和翻译文字。"
    "请问今天北京的天气怎么样？明天可能会下雨，所以出门的时候记得带伞。"
    "这个模型使用了大量的数据进行训练，它的推理能力非常强。"
    "如果你有任何问题，请随时告诉我，我会尽力给出详细的解释和例子。"
)


def _training_texts(seed: int = 0, han_sentences: int = 2000) -> List[str]:
    """English from hsdump's shipped conversations and generated Chinese (deterministic)."""
    texts = [_HAN_TEXT]
    path = Path(__file__).with_name("data") / "tiny_chat.jsonl"
    for line in path.read_text().splitlines():
        for turn in json.loads(line).get("conversations", []):
            texts.append(str(turn.get("value", "")))
    rng = random.Random(seed)
    for _ in range(han_sentences):
        words = [rng.choice(_HAN_WORDS) for _ in range(rng.randint(3, 12))]
        sep = [rng.choice(_HAN_PUNCT) if rng.random() < 0.2 else "" for _ in words]
        texts.append(
            "".join(w + s for w, s in zip(words, sep))
            + rng.choice(_HAN_PUNCT[:4])
            + (f" {rng.randint(0, 2025)}" if rng.random() < 0.3 else "")
        )
    return texts


def learn_byte_bpe(texts: List[str], num_merges: int) -> Dict[bytes, int]:
    """Tiktoken ranks: the 256 bytes (rank = byte value), then up to `num_merges` tokens that
    a byte-level BPE learns from `texts` with Kimi's pre-tokenizer, in merge order."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(KIMI_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=256 + num_merges,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(texts, trainer=trainer)
    decode = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes([b]): b for b in range(256)}
    for merge in json.loads(tk.to_str())["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = bytes(decode[c] for c in left + right)
        if token not in ranks:
            ranks[token] = len(ranks)
    return ranks


def write_kimi_style_tokenizer(
    dest: Union[str, Path],
    num_merges: int = 4000,
    chat_template: Optional[str] = None,
    ranks: Optional[Dict[bytes, int]] = None,
) -> Path:
    """Write `tiktoken.model` and `tokenizer_config.json` in Kimi-K2.5's layout into `dest`.

    The vocabulary: the 256 bytes and `num_merges` tokens learned from English and Chinese
    text (deterministic: the same files on every call), or `ranks` when given. Then 256 added
    tokens at Kimi-K2.5's offsets (`KIMI_SPECIAL_LAYOUT`: [BOS], [EOS], <|im_end|>,
    <|im_user|>, <|im_assistant|>, <|im_system|>, <|im_middle|>, the tool-call markers,
    <think>, </think>, [UNK], [PAD]; the rest `<|reserved_token_ID|>`), all in
    `added_tokens_decoder` as Kimi's config has them. `chat_template`: stored in the config
    (Kimi-K2.5 ships its template separately; none by default). Returns `dest`.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if ranks is None:
        ranks = learn_byte_bpe(_training_texts(), num_merges)
    write_tiktoken_bpe(dest / TIKTOKEN_FILE, ranks)
    base = len(ranks)
    decoder = {}
    for off in range(NUM_RESERVED_SPECIAL_TOKENS):
        name, special = KIMI_SPECIAL_LAYOUT.get(off, (f"<|reserved_token_{base + off}|>", True))
        decoder[str(base + off)] = {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(KIMI_DEFAULT_EXTRA_SPECIAL),
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (dest / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return dest
