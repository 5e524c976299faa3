"""The names `hsdump.data` had before it was split by stage; new code imports from the stages.

| stage | module |
| --- | --- |
| rows from a file, folder, package or the hub | `hsdump.sources` |
| a record to its conversation or text (row formats, bad rows) | `hsdump.formats` |
| chat templates and assistant spans | `hsdump.chat` |
| the tokenizer | `hsdump.tokenizer` |
| spans to (input_ids, loss_mask) | `hsdump.masks` |
| every row through all of the above, with the length policy | `hsdump.tokenization` |

This module coexists with the package-data folder `hsdump/data/` (tiny_chat.jsonl): that
folder has no `__init__.py`, and Python's path finder takes a module `data.py` over a
namespace package of the same name.
"""

from .chat import (TEMPLATES, _render, chat_spans, chat_template_of,  # noqa: F401
                   has_generation_markers, incremental_spans, require_template,
                   shipped_templates, template_path, template_sha256)
from .formats import (DEFAULT_COLUMN, FORMATS, MESSAGE_KEYS, MESSAGE_ROLES,  # noqa: F401
                      SHAREGPT_ROLES, BadRow, _content, _record, _tool_call, _turn_kind,
                      detect_format, peek_records, row_to_sample, to_messages)
from .masks import (encode_conversation, encode_with_spans,  # noqa: F401
                    tokenize_conversation, tokenize_text)
from .sources import (LOADER_VERSION, RAW, RAW_LINE, _is_saved_dataset,  # noqa: F401
                      _materialize_stream, _raw_dataset, _sha256_file, _source_info, cache_root,
                      dataset_fingerprint, load_json_file, load_rows, non_utf8, read_json_records,
                      resolve_data_path, source_info, split_json_array)
from .tokenization import (LENGTH_REASONS, MASK_VERSION, RowsView, Skip, length_policy,  # noqa: F401
                           Tokenized, _sample_fn, tokenize_dataset, tokenize_fingerprint)
from .tokenizer import load_tokenizer, tokenizer_sha256  # noqa: F401
