"""A task's payload type: the schema that a handler's payload annotation declares, checked when a
job is enqueued and decoded before the handler runs.

A pydantic model, a dataclass and a TypedDict are all three validated by pydantic: one set of
rules, one error format and one JSON schema for the three kinds, instead of a second validator
of our own for dataclasses and TypedDicts. pydantic is imported only when a handler declares
such a type (the `pydantic` extra); any other annotation (none, `dict`, `Any`, ...) leaves the
payload plain JSON and costs nothing."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import sys
import typing
from typing import Any

from ._redact import describe
from ._validate import MAX_DEPTH, MAX_TYPED_DEPTH, json_problem, too_deep
from ._version import DISTRIBUTION
from .errors import ConfigError, InvalidPayload, ValidationError

TOO_DEEP = (
    f"must not nest lists and objects more than {MAX_TYPED_DEPTH} deep (a typed payload: "
    "pydantic reads and validates it only so deep)"
)
_SHOWN_ERRORS = 3
"""The most of pydantic's errors one message names (the first is the error's `field`)."""
_DEPTH = 10
"""How deep in an annotation (`Annotated[list[Invoice | None], ...]`) a payload type is found."""
_SHOWN_KEY = 40
"""The most characters of one key (a payload's, maybe a megabyte) an error's path shows."""
_SHOWN_CHARACTERS = 300
"""The most characters of one error's message (a validator's, maybe a megabyte) shown."""


class PayloadType:
    """A handler's payload type and pydantic's adapter for it, built once at registration."""

    __slots__ = ("_adapter", "_schema", "annotation")

    def __init__(self, annotation: type, adapter: Any, schema: dict[str, Any]) -> None:
        self.annotation = annotation
        self._adapter = adapter
        self._schema = schema

    @property
    def name(self) -> str:
        return _name(self.annotation)

    def json_schema(self) -> dict[str, Any]:
        """pydantic's JSON schema of the payload (nested types under `$defs`), a copy."""
        return copy.deepcopy(self._schema)

    def openapi_schema(self, prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The schema for an OpenAPI document: the payload's, with its nested types as
        components named `prefix` + their name (returned apart, to be put in components)."""
        schema = self._adapter.json_schema(ref_template=f"#/components/schemas/{prefix}{{model}}")
        nested = schema.pop("$defs", {})
        return schema, {f"{prefix}{name}": value for name, value in nested.items()}

    def encode(self, payload: Any, field: str) -> Any:
        """`payload` (an instance of the type, or a dict of its fields) checked and made JSON,
        as it is stored; a ValidationError names the path of the first wrong field under
        `field` (`payload.items[2].sku`). The JSON is checked as the worker will decode it:
        pydantic does not check again an instance changed after it was built (nor one made by
        `model_construct`), and a serializer may write what its type does not read."""
        import pydantic
        import pydantic_core

        try:
            value = self._adapter.validate_python(payload)
        except pydantic.ValidationError as exc:
            path, message = _problem(exc, field)
            raise ValidationError(path, message) from None
        try:
            stored = self._adapter.dump_python(value, mode="json", warnings=False)
        except (pydantic_core.PydanticSerializationError, UnicodeError) as exc:
            raise ValidationError(field, f"cannot be written as JSON: {_said(str(exc))}") from None
        except ValueError:  # pydantic's own bound on recursion ("maximum serialization depth")
            raise ValidationError(field, TOO_DEEP) from None
        if too_deep(stored, MAX_TYPED_DEPTH):
            raise ValidationError(field, TOO_DEEP)
        if stored is None:  # enqueue stores JSON null as {}
            try:
                self._adapter.validate_python({})
            except pydantic.ValidationError:
                raise ValidationError(
                    field, f"None is stored as {{}}, which is not a valid {self.name}"
                ) from None
            return {}
        try:
            self._adapter.validate_python(stored)
        except pydantic.ValidationError as exc:
            path, message = _problem(exc, field)
            raise ValidationError(path, f"{message} (as written to JSON)") from None
        return stored

    def check_json(self, payload: Any, field: str) -> None:
        """ValidationError unless `payload`, a JSON value, fits the type as JSON Schema reads its
        schema (what the HTTP API's document promises): strictly, as JSON (no `"5"` nor `true`
        for an integer), a number without a fraction an integer (`5.0` is 5)."""
        import pydantic

        if too_deep(payload, MAX_TYPED_DEPTH):
            raise ValidationError(field, TOO_DEEP)
        try:
            text = json.dumps(_integral(payload, 0), allow_nan=False)
            self._adapter.validate_json(text, strict=True)
        except pydantic.ValidationError as exc:
            path, message = _problem(exc, field)
            raise ValidationError(path, message) from None
        except (ValueError, RecursionError) as exc:
            raise ValidationError(field, f"is not a JSON value it can check ({exc})") from None

    def decode(self, payload: Any) -> Any:
        """The stored payload as the handler's type. One that no longer fits it (written
        before the type changed) raises InvalidPayload: no retry can make it fit."""
        import pydantic

        try:
            return self._adapter.validate_python(payload)
        except pydantic.ValidationError as exc:
            path, message = _problem(exc, "payload")
            raise InvalidPayload(
                f"{path}: {message} (the stored payload does not fit {self.name}, the handler's "
                "payload type: written before the type changed? give the new field a default, "
                "or declare the next version with an upgrader that fills it, then replay)"
            ) from None


def _name(annotation: Any) -> str:
    """`Invoice`, or `app.Invoice | None` for what is not a class."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return str(annotation)


def _problem(exc: Any, field: str) -> tuple[str, str]:
    """The path of pydantic's first error under `field`, and a message naming the first few.
    pydantic's `msg` says what is allowed; the input (maybe a secret) is never repeated. A value
    nested deeper than pydantic follows is `field` too deep, as when given as an instance."""
    errors = exc.errors(include_url=False, include_input=False)
    if any(e.get("type") == "recursion_depth_exceeded" for e in errors):
        return field, TOO_DEEP
    said = [(_path(field, e.get("loc", ())), _message(e)) for e in errors]
    if not said:
        return field, "invalid"
    path, message = said[0]
    others = [f"{p}: {m}" for p, m in said[1:_SHOWN_ERRORS]]
    if len(said) > _SHOWN_ERRORS:
        others.append(f"{len(said) - _SHOWN_ERRORS} more")
    return path, message + (f"; also {'; '.join(others)}" if others else "")


def _message(error: Any) -> str:
    """pydantic's message of one error, without the one input it quotes (a discriminator's
    tag), shortened and escaped."""
    ctx = error.get("ctx") or {}
    if error.get("type") == "union_tag_invalid":
        return _said(
            f"Input tag found using {ctx.get('discriminator')} does not match any of the "
            f"expected tags: {ctx.get('expected_tags')}"
        )
    return _said(str(error.get("msg", "invalid")))


def _said(text: str, limit: int = _SHOWN_CHARACTERS) -> str:
    """`text` (a payload's key, a validator's message) fit for an error: control characters
    escaped, cut at `limit` characters."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit * 2])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _integral(value: Any, depth: int) -> Any:
    """`value` with each float without a fraction made an int: one number to JSON Schema."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if depth > MAX_DEPTH:  # past what enqueue accepts: refused there
        return value
    if isinstance(value, dict):
        return {k: _integral(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v, depth + 1) for v in value]
    return value


def _path(field: str, loc: tuple[Any, ...]) -> str:
    path = field
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{_said(str(part), _SHOWN_KEY)}"
    return path


def payload_type(fn: Any, task: str) -> PayloadType | None:
    """The payload type `fn(ctx, payload)` declares for task `task`: its second parameter's
    annotation (resolved with typing.get_type_hints, so that `from __future__ import
    annotations` works) when that is a pydantic model, a dataclass or a TypedDict; else None.
    Decided once, at registration."""
    who = f"task {task!r} (handler {getattr(fn, '__qualname__', fn)!r})"
    annotation = _annotation(fn, who)
    if not _typed(annotation):
        return None
    try:
        import pydantic
    except ImportError:
        raise ConfigError(
            "handler",
            f"{who}: its payload type {_name(annotation)} is checked and decoded "
            f"by pydantic, which is not installed: pip install '{DISTRIBUTION}[pydantic]' (or "
            "annotate the payload as dict)",
        ) from None
    try:
        adapter = pydantic.TypeAdapter(annotation)
        schema = adapter.json_schema()
    except Exception as exc:
        raise ConfigError(
            "handler",
            f"{who}: pydantic cannot build a schema of its payload type {_name(annotation)}: {exc}",
        ) from None
    return PayloadType(annotation, adapter, schema)


def _annotation(fn: Any, who: str) -> Any:
    """The annotation of `fn`'s second positional parameter, resolved; None without one."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature: a builtin, say
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = [p for p in parameters if p.kind in positional]
    if len(parameters) < 2 or parameters[1].annotation is inspect.Parameter.empty:
        return None
    name, raw = parameters[1].name, parameters[1].annotation
    if not isinstance(raw, str):
        return raw
    try:
        return typing.get_type_hints(fn)[name]
    except Exception:
        pass
    # Another parameter's annotation may be what does not resolve: the payload's alone.
    target = inspect.unwrap(fn)
    holder = type("_Payload", (), {"__annotations__": {name: raw}})
    namespace = getattr(target, "__globals__", None) or vars(
        sys.modules.get(getattr(target, "__module__", ""), typing)
    )
    try:
        return typing.get_type_hints(holder, globalns=namespace)[name]
    except Exception as exc:
        raise ConfigError(
            "handler",
            f"{who}: its payload annotation {raw!r} cannot be resolved ({exc}); "
            "import the type at module level (not under `if TYPE_CHECKING:`)",
        ) from None


def _typed(annotation: Any, depth: int = 0) -> bool:
    """Whether `annotation` declares a payload schema: a pydantic model, a dataclass or a
    TypedDict (typing's or typing_extensions'), or a type holding one (`Invoice | None`,
    `Annotated[Invoice, ...]`, `list[Invoice]`), whose handler expects the model, not a dict."""
    if not isinstance(annotation, type) or typing.get_args(annotation):
        args = typing.get_args(annotation)
        origin = typing.get_origin(annotation)
        return depth < _DEPTH and any(_typed(a, depth + 1) for a in (origin, *args) if a)
    if dataclasses.is_dataclass(annotation) or typing.is_typeddict(annotation):
        return True
    extensions = sys.modules.get("typing_extensions")
    if extensions is not None and extensions.is_typeddict(annotation):
        return True
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(annotation, pydantic.BaseModel)


def json_text(field: str, value: Any, what: str, consequence: str) -> str:
    """`value` as compact JSON text storable in jsonb, or a ValidationError naming `field`:
    "{what} {problem}; {consequence}"."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        problem: str | None = f"must not nest lists and objects more than {MAX_DEPTH} deep"
    except Exception as exc:  # the value's own methods ran: anything may come out
        problem = f"is not JSON-serialisable ({describe(exc)})"
    else:
        problem = json_problem(text, value)
    if problem is not None:
        raise ValidationError(field, f"{what} {problem}; {consequence}".lstrip())
    return text
