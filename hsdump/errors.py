"""What hsdump refuses: bad input, named with its fix.

`Refusal` is what hsdump raises for input it will not take (a config value, a path, a dataset, a
model): the message names the problem and the fix. It is a ValueError, so callers that catch
ValueError keep working; `MissingInput` (a path that does not exist) is also a
FileNotFoundError. `hsdump extract` exits 2 for a refusal and only for one (docs/errors.md):
another error, a library's ValueError included, is a failure with its traceback (exit 1), which
`hsdump ray` retries; a refusal it does not retry (the same input is refused again).
"""

from __future__ import annotations

from typing import Optional


class Refusal(ValueError):
    """Input hsdump refuses; the message says what to change."""


class MissingInput(Refusal, FileNotFoundError):
    """A path the input names does not exist (or is not what it should be)."""


def hydra_usage_error(e: Optional[BaseException]) -> bool:
    """Hydra's own refusal of a command line: an override it cannot parse, a key the config has
    no place for or a value of the wrong type, a config group choice that does not exist."""
    from hydra.errors import ConfigCompositionException, OverrideParseException, SearchPathException

    return isinstance(e, (ConfigCompositionException, OverrideParseException, SearchPathException))
