"""mkdocs hooks: the reference parts of the CLI and HTTP API pages are generated when the site is
built, from the argparse parser and from the OpenAPI document of `pgworker serve`, so that they
cannot drift from the code. A page asks for one with a marker line (`<!-- generated: cli -->`).
tests/test_docs.py renders the same Markdown to check its links."""

from __future__ import annotations

import argparse
import html
from collections.abc import Callable, Iterator
from typing import Any

CLI = "<!-- generated: cli -->"
HTTP_API = "<!-- generated: http-api -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, render in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown


def text(value: str) -> str:
    """Plain text as Markdown on one line: no markup or HTML but its `code` spans."""
    parts = " ".join(value.split()).split("`")
    for i, part in enumerate(parts):
        if i % 2 == 0:  # outside a code span
            part = html.escape(part, quote=False)
            parts[i] = part.replace("*", r"\*").replace("_", r"\_").replace("[", r"\[")
    return "`".join(parts).replace("|", r"\|")


def number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


# The CLI


def commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command's parser by its full name (`failed list`), in the order of `--help`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from commands(sub, f"{prefix}{name} ")


def arguments(parser: argparse.ArgumentParser) -> str:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = (
                formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
            )
            name = ", ".join(
                f"`{o}{' ' + metavar if metavar else ''}`" for o in action.option_strings
            )
        else:
            name = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
        said = formatter._expand_help(action) if action.help else ""
        if action.choices is not None and not said:
            said = "one of " + ", ".join(map(str, action.choices))
        rows.append(f"| {name} | {text(said)} |")
    if not rows:
        return ""
    return "| argument | what it does |\n|---|---|\n" + "\n".join(rows)


def cli_reference() -> str:
    """Each command: its usage, description, arguments and examples, as `--help` prints them."""
    from pgworker.cli import build_parser

    parser = build_parser()
    parts = []
    for name, sub in commands(parser):
        parts.append(f"### pgworker {name}")
        if sub.description:
            parts.append(text(sub.description))
        parts.append(f"```text\n{sub.format_usage().strip()}\n```")
        table = arguments(sub)
        if table:
            parts.append(table)
        if sub.epilog:
            parts.append(f"```text\n{sub.epilog.strip()}\n```")
    return "\n\n".join(parts) + "\n"


# The HTTP API


def schema_text(schema: dict[str, Any], spec: dict[str, Any]) -> str:
    """A JSON schema in a few words: its types and the bounds the server checks."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return "any JSON value" if name == "JsonValue" else name
    if "anyOf" in schema:
        kinds = [schema_text(s, spec) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds)) or "null"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and "items" in schema:
        kind = f"array of {schema_text(schema['items'], spec)}"
    if kind == "object" and "additionalProperties" in schema and schema["additionalProperties"]:
        values = schema["additionalProperties"]
        if isinstance(values, dict) and values:
            kind = f"object of {schema_text(values, spec)}"
    if "enum" in schema:
        kind = "one of " + ", ".join(f"`{v}`" for v in schema["enum"])
    bounds = []
    for key, word in (("minimum", "≥"), ("maximum", "≤")):
        if key in schema:
            bounds.append(f"{word} {number(schema[key])}")
    if "minLength" in schema or "maxLength" in schema:
        bounds.append(f"{schema.get('minLength', 0)} to {schema.get('maxLength', '…')} characters")
    if "minItems" in schema:
        bounds.append(f"at least {schema['minItems']} item(s)")
    if "format" in schema:
        bounds.append(schema["format"])
    if "default" in schema:
        bounds.append(f"default {schema['default']}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def body_table(
    schema: dict[str, Any], spec: dict[str, Any], required_word: str = "required"
) -> str:
    schema = resolve(schema, spec)
    required = set(schema.get("required", ()))
    rows = [
        f"| `{name}` | {'yes' if name in required else 'no'} | {text(schema_text(prop, spec))} "
        f"| {text(prop.get('description', ''))} |"
        for name, prop in schema.get("properties", {}).items()
    ]
    head = f"| field | {required_word} | type | what it is |\n|---|---|---|---|\n"
    return head + "\n".join(rows)


def http_reference() -> str:
    """Every operation of the OpenAPI document: its parameters, body and answers."""
    from pgworker._web.app import WebConfig, create_app

    spec = create_app(WebConfig("postgresql://docs@localhost/docs", tokens=("docs",))).openapi()
    parts = []
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            parts.append(f"### {method.upper()} {path}")
            if op.get("description"):
                parts.append(text(op["description"]))
            if op.get("security"):
                parts.append("Needs `Authorization: Bearer TOKEN`.")
            params = op.get("parameters", [])
            if params:
                rows = [
                    f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                    f"| {text(schema_text(p.get('schema', {}), spec))} "
                    f"| {text(p.get('description', ''))} |"
                    for p in params
                ]
                parts.append(
                    "| parameter | in | required | type | what it is |\n|---|---|---|---|---|\n"
                    + "\n".join(rows)
                )
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                parts.append("Body (JSON):\n\n" + body_table(body["schema"], spec))
            answers = [
                f"| {status} | {text(answer.get('description', ''))} |"
                for status, answer in sorted(op.get("responses", {}).items())
            ]
            parts.append("| status | when |\n|---|---|\n" + "\n".join(answers))
            for status, answer in sorted(op.get("responses", {}).items()):
                content = answer.get("content", {}).get("application/json")
                if status.startswith("2") and content:
                    fields = body_table(content["schema"], spec, "always there")
                    parts.append(f"Answer {status} (JSON):\n\n{fields}")
                    break
    return "\n\n".join(parts) + "\n"


GENERATED: dict[str, Callable[[], str]] = {CLI: cli_reference, HTTP_API: http_reference}
