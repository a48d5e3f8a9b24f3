"""Secrets kept out of what pgworker stores and logs: the error texts of failed attempts
(`jobs.error`, `job_attempts.error_message` and `error_detail`), the runtime's log lines, the
payloads `pgworker show` prints, and the DSN in every message.

What is replaced by `[REDACTED]`, in this order:

(a) the values of the payload's keys whose name contains one of the sensitive words (any depth;
    scalar values of 4 characters or more as text, since shorter ones would shred ordinary words;
    a list or object under such a key has all its scalar values redacted), wherever they appear;
(b) the password of a URL (`scheme://user:PASSWORD@host`);
(c) the value of `key=value`, `key: value` and `"key": "value"` (or `'key': 'value'`) pairs whose
    key contains a sensitive word;
(d) the token after `Bearer`.

Nothing here runs for a job that completes: only failures are redacted. The patterns of a word
list are compiled once (`redactor`); what depends on the payload is built per failure.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

from ._validate import clean_text

REDACTED = "[REDACTED]"
DEFAULT_KEYS: tuple[str, ...] = (
    "password",
    "passwd",
    "secret",
    "token",
    "authorization",
    "api_key",
    "apikey",
    "private_key",
    "credential",
)
"""The words a sensitive key's name contains (case-insensitively): Settings.redact_keys."""
MIN_VALUE = 4
"""Payload values shorter than this are not searched for in texts."""
MAX_SECRETS = 1000
"""The most forms of the payload's sensitive values searched for in a text (each costs a scan):
a payload holding more has its failures' texts withheld whole (WITHHELD), never searched for
seconds on the event loop."""
WITHHELD = (
    f"[REDACTED: the payload holds more than {MAX_SECRETS:,} forms of sensitive values; "
    "the text is withheld]"
)
MESSAGE_LIMIT = 500
"""A stored error message: its first line, at most this many characters."""
DETAIL_LIMIT = 8 * 1024
"""A stored traceback (`error_detail`): at most this many bytes of UTF-8."""
_DETAIL_HEAD = 2 * 1024
"""A longer traceback keeps its beginning and, mostly, its end (where the exception is)."""
_SCANNED = 64 * 1024
"""A text is cut to this before it is redacted (its beginning and end), well above what is kept,
so that a secret cut in two by the final cut is never left half shown."""

# Bounded repetitions and a look-behind anchoring each key at the start of its word: every
# pattern stays linear in the text, whatever a hostile message holds.
_URL_PASSWORD = re.compile(
    r"(\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/@'\"]{0,256}:)[^\s@/'\"]{1,1024}@"
)
_BEARER = re.compile(r"\b(bearer)\s+[A-Za-z0-9\-._~+/]+=*", re.IGNORECASE)
_PAIR = r"""
    (?<![\w.\-])
    (?P<key>(?P<q>["']?)(?=[\w.\-]*?(?:{words}))[\w.\-]+(?P=q))
    (?P<sep>\s*[:=]\s*)
    (?P<value>
        \[REDACTED\]
      | (?:bearer|basic|token|digest)\s+[^\s,;'"]+
      | "(?:[^"\\\n]|\\.)*"
      | '(?:[^'\\\n]|\\.)*'
      | [^\s,;&'"(){{}}\[\]<>]+
    )
"""


def _pair_replacement(found: re.Match[str]) -> str:
    value = found.group("value")
    quote = value[0] if value[0] in "\"'" else ""
    return f"{found.group('key')}{found.group('sep')}{quote}{REDACTED}{quote}"


class Redactor:
    """The redaction for one list of sensitive words, its patterns compiled once."""

    __slots__ = ("_pairs", "_sensitive", "keys")

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = tuple(k.lower() for k in keys if k)
        words = "|".join(re.escape(k) for k in sorted(self.keys, key=len, reverse=True))
        self._sensitive = re.compile(words, re.IGNORECASE) if words else None
        self._pairs = (
            re.compile(_PAIR.format(words=words), re.IGNORECASE | re.VERBOSE) if words else None
        )

    def sensitive(self, name: Any) -> bool:
        """Whether a payload key's name contains one of the words."""
        return (
            self._sensitive is not None
            and isinstance(name, str)
            and bool(self._sensitive.search(name))
        )

    def secrets(self, payload: Any) -> list[str] | None:
        """The texts of the payload's sensitive values (4 characters or more), as they may show
        in a message: as they are, and as `repr`, JSON and URL encoding write them when that
        differs; None when there are more than MAX_SECRETS of them."""
        found: set[str] = set()
        if self._sensitive is None:
            return []
        stack: list[tuple[Any, bool]] = [(payload, False)]
        while stack:
            if len(found) > MAX_SECRETS:
                return None
            value, hidden = stack.pop()
            if isinstance(value, dict):
                stack.extend((v, hidden or self.sensitive(k)) for k, v in value.items())
            elif isinstance(value, list | tuple):
                stack.extend((v, hidden) for v in value)
            elif hidden and value is not None and not isinstance(value, bool):
                text = value if isinstance(value, str) else str(value)
                if len(text) >= MIN_VALUE:
                    found.add(text)
                    if isinstance(value, str):
                        found.add(repr(value)[1:-1])
                        found.add(json.dumps(value)[1:-1])
                        found.add(json.dumps(value, ensure_ascii=False)[1:-1])
                        found.add(quote(value, safe=""))
                        found.add(quote(value))  # the default keeps "/" as it is
                        found.add(quote_plus(value, safe=""))
                        found.add(quote_plus(value))
        if len(found) > MAX_SECRETS:
            return None
        return sorted((s for s in found if len(s) >= MIN_VALUE), key=len, reverse=True)

    def text(self, text: str, payload: Any = None, extra: Iterable[str] = ()) -> str:
        """`text` with the payload's secrets (and `extra` texts), in any letter case, and the
        patterns redacted; WITHHELD when the payload holds too many secrets to search for."""
        secrets = self.secrets(payload)
        if secrets is None:
            return WITHHELD
        values = [*secrets, *(e for e in extra if len(e) >= MIN_VALUE)]
        if values:
            # Only those the text holds go into the pattern: a scan each, at C speed, rather
            # than an alternation of every one tried at each position of the text.
            folded = text.lower()
            present = sorted((v for v in values if v.lower() in folded), key=len, reverse=True)
            if present:
                pattern = "|".join(re.escape(v) for v in present)
                text = re.sub(pattern, REDACTED, text, flags=re.IGNORECASE)
        if "://" in text:
            text = _URL_PASSWORD.sub(rf"\1{REDACTED}@", text)
        if self._pairs is not None:
            text = self._pairs.sub(_pair_replacement, text)
        return _BEARER.sub(rf"\1 {REDACTED}", text)

    def payload(self, payload: Any) -> Any:
        """A copy of `payload` with the values of its sensitive keys replaced, at any depth
        (iteratively: a payload nested as deep as enqueue allows would exhaust the stack)."""
        if not isinstance(payload, dict | list):
            return payload
        top: dict[Any, Any] | list[Any] = {} if isinstance(payload, dict) else []
        stack: list[tuple[Any, dict[Any, Any] | list[Any]]] = [(payload, top)]
        while stack:
            source, copy = stack.pop()
            items = source.items() if isinstance(source, dict) else enumerate(source)
            for k, v in items:
                if isinstance(source, dict) and self.sensitive(k):
                    v = REDACTED
                elif isinstance(v, dict | list):
                    child: dict[Any, Any] | list[Any] = {} if isinstance(v, dict) else []
                    stack.append((v, child))
                    v = child
                if isinstance(copy, dict):
                    copy[k] = v
                else:
                    copy.append(v)
        return top


@cache
def redactor(keys: tuple[str, ...] = DEFAULT_KEYS) -> Redactor:
    """The redactor of a word list, made once per list."""
    return Redactor(keys)


def redact_payload(payload: Any, keys: Sequence[str] = DEFAULT_KEYS) -> Any:
    """A copy of `payload` for display, the values of the keys whose name contains one of `keys`
    (case-insensitively, at any depth) replaced by `[REDACTED]`."""
    return redactor(tuple(keys)).payload(payload)


def scrub(text: str) -> str:
    """The runtime's own messages (database errors, a service's failure): the patterns of the
    default words, URL passwords and bearer tokens, without a payload to search."""
    return redactor().text(_scanned(text))


def _scanned(text: str) -> str:
    if len(text) <= _SCANNED:
        return text
    return text[: _SCANNED // 4] + "\n...\n" + text[-(_SCANNED * 3 // 4) :]


def summary(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """The first non-blank line of a (redacted) message, at most `limit` characters."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def detail(text: str) -> str:
    """A (redacted) traceback cut to DETAIL_LIMIT bytes: its beginning and its end."""
    if len(text) * 4 <= DETAIL_LIMIT or len(text.encode()) <= DETAIL_LIMIT:
        return text
    marker = "\n... [cut] ...\n"
    head = _cut_bytes(text, _DETAIL_HEAD)
    tail_bytes = DETAIL_LIMIT - len(head.encode()) - len(marker)
    tail = text.encode()[-tail_bytes:].decode(errors="ignore")
    return head + marker + tail


def _cut_bytes(text: str, limit: int) -> str:
    return text.encode()[:limit].decode(errors="ignore")


def error_parts(exc: BaseException, limit: int = 2000) -> tuple[str, str]:
    """An exception's type name and message as stored, whatever the exception does: a `__str__`
    that raises gives a note instead, NUL is shown as `\\x00` and lone surrogates as U+FFFD (a
    text column holds neither), and the message is cut at `limit` characters."""
    try:
        name = str(type(exc).__name__)
    except BaseException:  # a hostile class: any method of it may raise anything
        name = "Exception"
    try:
        message = str(exc)
    except BaseException as inner:
        message = f"<its message could not be read: str() raised {type(inner).__name__}>"
    return clean_text(name[:200]), clean_text(message[:limit])


def describe(exc: BaseException, limit: int = 2000) -> str:
    """`Type: message`, as `error_parts` makes them, with URL passwords, bearer tokens and the
    values of `password=...`-like pairs redacted (`scrub`): the runtime's log lines and
    messages carry this, never an exception's text as it is."""
    name, message = error_parts(exc, 16 * limit)
    return scrub(f"{name}: {message}" if message else name)[: len(name) + 2 + limit]


def error_texts(
    exc: BaseException, keys: Redactor, payload: Any, message: str
) -> tuple[str, str | None]:
    """The stored forms of a handler's exception whose message (read once by the caller) is
    `message`: its redacted first line, at most MESSAGE_LIMIT characters, and its redacted
    traceback cut to DETAIL_LIMIT bytes (None when it cannot be formatted)."""
    first = summary(message, _SCANNED)
    stored = summary(keys.text(first, payload))
    try:
        formatted = "".join(traceback.format_exception(exc))
    except BaseException:  # a hostile exception: its methods may raise anything
        return stored, None
    return stored, detail(clean_text(keys.text(_scanned(formatted), payload)))


def dsn_secrets(dsn: str) -> list[str]:
    """The password a DSN carries (as written and decoded), to keep out of messages."""
    found: list[str] = []
    try:
        password = urlsplit(dsn).password if "://" in dsn else None
    except ValueError:
        password = None
    if password:
        found += [password, unquote(password)]
    found += re.findall(r"\bpassword\s*=\s*'?([^\s']+)", dsn, re.IGNORECASE)
    return found


def redact_dsn(text: str, dsn: str) -> str:
    """A message about connecting to `dsn`, without its password."""
    return redactor().text(text, extra=dsn_secrets(dsn))


def shown_dsn(dsn: str) -> str:
    """A DSN as it may be shown: its password replaced."""
    return redact_dsn(dsn, dsn)
