"""`--schema FILE`: the JSON schema an answer must match, read and checked before any model call."""

from __future__ import annotations

import json

TYPE_CHECKING = False     # mypy reads it as typing's; nothing imported at run time
if TYPE_CHECKING:
    from typing import Any


def read_schema(arg: str | None) -> Any:
    """`--schema FILE`: a JSON schema the answer must match (checked before any model call)."""
    from pathlib import Path

    from recursa.frontend.options import OptionError
    if arg is None:
        return None
    try:
        schema = json.loads(Path(arg).read_text())
    except OSError as e:
        raise OptionError(f"--schema {arg}: cannot read it ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise OptionError(f"--schema {arg}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(schema, dict):
        raise OptionError(f"--schema {arg}: a JSON schema is an object, got {type(schema).__name__}")
    from recursa.core.output import OutputSpec
    try:
        return OutputSpec.of(schema)
    except ValueError as e:
        raise OptionError(f"--schema {arg}: {e}") from None
