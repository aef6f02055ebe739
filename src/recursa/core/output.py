"""Typed answers: `RLM.completion(query, context, output=Model)` (or a JSON schema dict).

The root model is told the schema with the query; a committed answer is checked against it, and
one that does not validate is sent back with the validation error (it stays the draft) while
the run's budget allows. `Result.parsed` holds the validated object; `Result.output_error` says
why the last answer did not validate.

`OutputSpec.of(output)` is the seam the CLI (`--schema`) and the server (`response_format`)
use: give it a pydantic model class (or any type pydantic's TypeAdapter takes) or a JSON schema
dict; `spec.schema` is the JSON schema, `spec.parse(text)` the validated value or
`OutputInvalid` with a short message for the model.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from pydantic import TypeAdapter, ValidationError

MAX_ERRORS = 5          # validation errors listed to the model
_FENCED_JSON = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n[ \t]*```", re.S)


class OutputInvalid(ValueError):
    """An answer that does not match the output schema; the message is written for the model."""


class OutputSpec:
    """What a typed answer must be. Build with `OutputSpec.of(output)`."""

    def __init__(self, schema: dict[str, Any], adapter: TypeAdapter[Any] | None = None):
        self.schema = schema
        self._adapter = adapter
        self._validator: Any = None
        if adapter is None:
            try:
                import jsonschema
            except ImportError as e:     # a declared dependency; a broken install says so
                raise ImportError("a JSON-schema `output` needs the jsonschema package "
                                  "(pip install jsonschema)") from e
            cls = jsonschema.validators.validator_for(schema)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as e:
                raise ValueError(f"output: not a valid JSON schema: {e.message}") from None
            self._validator = cls(schema)

    @classmethod
    def of(cls, output: Any) -> OutputSpec:
        """A JSON schema dict, a pydantic model class, or a type TypeAdapter accepts
        (`list[Item]`, a dataclass, a TypedDict); an OutputSpec is returned as it is."""
        if isinstance(output, OutputSpec):
            return output
        if isinstance(output, dict):
            return cls(output)
        if isinstance(output, str | bytes | int | float | list | tuple):
            raise TypeError(f"output must be a pydantic model class or a JSON schema dict, "
                            f"not {type(output).__name__}")
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(output)
            schema = adapter.json_schema()
        except Exception as e:
            raise TypeError(f"output: pydantic cannot validate {output!r}: {e}") from None
        return cls(schema, adapter)

    def prompt(self) -> str:
        """What the root is told with the query."""
        return ("The final answer must be a JSON value matching this JSON schema (commit it "
                f"with {self.commit_example()}):\n" + json.dumps(self.schema, ensure_ascii=False))

    def commit_example(self) -> str:
        """How to commit a value of this schema, spelled out for an object's fields (small
        models copy this line far more reliably than they read a schema)."""
        props = self.schema.get("properties")
        if self.schema.get("type") != "object" or not isinstance(props, dict) or not props:
            return "FINAL(json.dumps(value))"
        names = [k if k.isidentifier() else re.sub(r"\W", "_", k) for k in props]
        fields = ", ".join(f"{json.dumps(k)}: {n}" for k, n in zip(props, names, strict=True))
        return f"FINAL(json.dumps({{{fields}}})) after setting {', '.join(names)} from the output"

    def structuring_request(self, text: str, client_name: Any
                            ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Messages and options for one sub-call that fills this schema from an answer the root
        wrote as plain text. The reply is constrained to the schema where the client can do it
        (llama.cpp's json_schema; response_format on OpenAI-compatible servers): as the client
        (a ModelClient, or its spec name) declares, else as its provider's clients do."""
        schema = json.dumps(self.schema, ensure_ascii=False)
        messages = [
            {"role": "system", "content": "You turn an answer written as text into JSON matching "
             "a JSON schema. Use only facts stated in the text; reply with the JSON only."},
            {"role": "user", "content": f"Schema:\n{schema}\n\nText:\n{text}\n\nJSON:"}]
        options: dict[str, Any] = {"temperature": 0.0, "max_tokens": 1024}
        from recursa.models.registry import structured_output
        how = structured_output(client_name)
        if how == "json_schema":
            options["json_schema"] = self.schema
        elif how == "response_format":
            options["response_format"] = {"type": "json_schema",
                                          "json_schema": {"name": "answer", "schema": self.schema}}
        return messages, options

    def looks_structured(self, answer: str) -> bool:
        """Whether `answer` is JSON (or a Python literal) at all, right or wrong."""
        try:
            _decode(answer)
        except OutputInvalid:
            return False
        return True

    def parse(self, answer: str) -> Any:
        """The validated value of `answer` (JSON, possibly fenced; or a Python literal such as
        FINAL(some_dict) commits); OutputInvalid if it does not match."""
        value = _decode(answer)
        if self._adapter is not None:
            try:
                return self._adapter.validate_python(value)
            except ValidationError as e:
                raise OutputInvalid(_pydantic_errors(e)) from None
        errors = sorted(self._validator.iter_errors(value), key=lambda err: list(err.path))
        if errors:
            lines = [f"{_path(err.absolute_path)}: {err.message}" for err in errors[:MAX_ERRORS]]
            raise OutputInvalid("\n".join(lines))
        return value


def _decode(answer: str) -> Any:
    text = answer.strip()
    m = _FENCED_JSON.search(text)
    if m:
        text = m.group(1).strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        try:   # FINAL(d) with a dict commits its Python repr: {'a': 1, 'b': True}
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
        raise OutputInvalid(f"the answer is not JSON ({e.msg} at line {e.lineno} column "
                            f"{e.colno}): {text[:200]!r}") from None


def _path(parts: Any) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    return "$" + path


def _pydantic_errors(e: ValidationError) -> str:
    lines = [f"{_path(err['loc'])}: {err['msg']}"
             for err in e.errors(include_url=False)[:MAX_ERRORS]]
    more = e.error_count() - MAX_ERRORS
    return "\n".join(lines + ([f"... and {more} more"] if more > 0 else []))
