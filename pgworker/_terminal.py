"""Text from the database (types, queues, errors, tracebacks, worker ids, milestones, payloads) is
anybody's: `terminal` escapes what a terminal would obey in it, and the CLI passes everything it
prints through it (cli.say), the console log through `_logs`. A value that sits on one line of
a table or list goes through `cell` (its newlines too), so it cannot fake a line."""

from __future__ import annotations

import re

_CONTROLS = "\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_UNSAFE = re.compile(f"[{_CONTROLS}]")
_UNSAFE_OR_NEWLINE = re.compile(f"[\n{_CONTROLS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(found: re.Match[str]) -> str:
    char = found.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(text: str) -> str:
    """`text` safe to write to a terminal: every character a terminal or a reader would obey
    rather than show is written as its visible escape (`\\x1b`, `\\r`, `\\x9b`, `\\u202e`): the
    C0 controls but the newline (ESC, CR, tab, BEL...), DEL, the C1 controls U+0080-U+009F (the
    8-bit CSI U+009B among them), the bidirectional embeddings, overrides and isolates
    (U+202A-U+202E, U+2066-U+2069: they reorder what is shown, as in "Trojan Source") and the
    line and paragraph separators U+2028, U+2029. Every other character, backslashes too, is
    kept: an escape reads like Python's, it is not meant to be parsed back."""
    return _UNSAFE.sub(_escaped, text)


def cell(value: object) -> str:
    """A value that sits on one line among others: `terminal`, and its newlines escaped too."""
    return _UNSAFE_OR_NEWLINE.sub(_escaped, str(value))
