"""The documentation as tests read it: the README and every page of the site (docs/**/*.md), their
fenced code blocks, and the paragraphs and sections that tests quote."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^([ \t]*)```([\w-]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    body: str
    """The block's text, its indentation (inside a list item) taken off."""

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.body.partition("\n")[0].strip()

    @property
    def rest(self) -> str:
        return self.body.partition("\n")[2]


def page(name: str) -> str:
    """A page of the site by its path under docs/ (`operations/states.md`), or the README."""
    return (ROOT / name if name == "README.md" else ROOT / "docs" / name).read_text()


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        indent = m[1]
        body = "\n".join(
            line.removeprefix(indent) for line in m[3].split("\n")
        )  # a block in a list item is indented with it
        found.append(Block(path, text.count("\n", 0, m.start()) + 1, m[2], body))
    return found


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc)]


def paragraph(text: str, starting: str) -> str:
    """The paragraph of `text` that starts with `starting`, its lines joined."""
    at = text.index(starting)
    return " ".join(text[at:].split("\n\n", 1)[0].split())


def section(text: str, heading: str) -> str:
    """From the heading line `heading` (`## Metrics`) to the next heading of its level or above."""
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ", 1)[0]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start + 1 :], re.M)]
    following = [e for e in ends if e > 0]
    return text[start : start + 1 + following[0]] if following else text[start:]


SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::(\w+))?"$', re.M)


def hooks():  # type: ignore[no-untyped-def]
    """docs/hooks.py, the module mkdocs runs to generate the CLI and HTTP API references."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def included(match: re.Match[str]) -> str:
    text = (ROOT / match[1]).read_text()
    if match[2] is None:
        return text
    start = text.index(f"--8<-- [start:{match[2]}]")
    start = text.index("\n", start) + 1
    return text[start : text.rindex("\n", 0, text.index(f"--8<-- [end:{match[2]}]"))]


def rendered(path: Path) -> str:
    """A page's Markdown as the site renders it: snippets included, references generated."""
    text = SNIPPET.sub(included, path.read_text())
    if path.parent == ROOT / "docs" or (ROOT / "docs") in path.parents:
        text = hooks().on_page_markdown(text)
    return text
