"""Named operators: who may use `pgworker serve` or a mounted dashboard, each
with a name (what the operator log and job_events record) and a role: `read` sees everything and
changes nothing, `operate` may also press buttons and send every write of the API.

Operators come from a tokens file (`name:token:role` a line), from $PGWORKER_TOKENS (the same,
separated by commas or newlines), from the older single-token options (--token,
$PGWORKER_API_TOKEN: one operator named `token`, role operate, each), or from a reverse proxy's
header (`--trusted-user-header`). A token is never part of an error message."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError

Role = Literal["read", "operate"]
ROLES: tuple[Role, ...] = ("read", "operate")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: a `read` operator may send these and no other."""
SHARED_NAME = "token"
"""The name of an operator of --token or $PGWORKER_API_TOKEN (a token without a name)."""

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")
"""An operator's name: what the operator log records; a proxy's user (an e-mail) fits too."""
TOKEN = re.compile(r"[!-~]{1,1000}")
"""A token: visible ASCII (no space), 1 to 1000 characters, without a comma."""
MIN_TOKEN = 16
"""The shortest token a tokens file or $PGWORKER_TOKENS accepts (a named operator's)."""


@dataclass(frozen=True, slots=True)
class Operator:
    """One operator: `name` (letters, digits and `._@+-`, 1 to 100), `token` (16 to 1000
    visible ASCII characters, no comma; what the operator sends as `Bearer TOKEN` or types in the
    login form) and `role` (`read` or `operate`). Invalid values raise ConfigError naming the
    field; the token is never shown (not in the error, not in repr)."""

    name: str
    token: str
    role: Role = "operate"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise ConfigError(
                "name",
                "an operator's name is 1 to 100 letters, digits or ._@+- (starting with a "
                "letter or digit)",
            )
        if (
            not isinstance(self.token, str)
            or not TOKEN.fullmatch(self.token)
            or "," in self.token
            or (len(self.token) < MIN_TOKEN and self.name != SHARED_NAME)
        ):
            raise ConfigError(
                "token",
                f"an operator's token is {MIN_TOKEN} to 1000 visible ASCII characters, without "
                "spaces or commas",
            )
        if self.role not in ROLES:
            raise ConfigError("role", "an operator's role is read or operate")

    def __repr__(self) -> str:
        return f"Operator(name={self.name!r}, token='***', role={self.role!r})"

    @property
    def may_operate(self) -> bool:
        return self.role == "operate"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sends a request: an operator's name and role. `named` is false for the shared token
    of --token and for --insecure-no-auth: their actions are recorded as before (`dashboard`,
    or the API's `by`, else `api`)."""

    name: str
    role: Role
    named: bool = True
    ambient: bool = False
    """Whether the browser sends it by itself (a trusted proxy's header, or --insecure-no-auth),
    rather than a token its client chose to send: a page of another site can make a browser send
    it, so a change under it must come from the same site (guard.cross_site)."""

    @property
    def may_operate(self) -> bool:
        return self.role == "operate"


ANONYMOUS = Identity("anonymous", "operate", named=False, ambient=True)
"""Everyone, with --insecure-no-auth."""


def parse(text: str, source: str, *, separators: str = "\n") -> tuple[Operator, ...]:
    """The operators of `text`, one `name:token:role` an entry (entries split at any of
    `separators`; blank ones and `#` comments skipped). A bad entry raises ConfigError naming
    `source` and its line (or entry) number, never the token."""
    found: list[Operator] = []
    entries = re.split(f"[{re.escape(separators)}]", text)
    unit = "line" if separators == "\n" else "entry"
    for number, raw in enumerate(entries, start=1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        where = f"{source} {unit} {number}"
        name, sep, rest = entry.partition(":")
        token, sep2, role = rest.rpartition(":")
        if not sep or not sep2 or not name or not token:
            raise ConfigError(where, "write name:token:role (role read or operate)")
        try:
            found.append(Operator(name.strip(), token.strip(), role.strip()))  # type: ignore[arg-type]
        except ConfigError as exc:
            raise ConfigError(where, str(exc)) from None
    return unique(found, source)


def unique(operators: Iterable[Operator], source: str) -> tuple[Operator, ...]:
    """The operators, refused (ConfigError naming `source`) when two share a name or a token."""
    names: set[str] = set()
    tokens: set[str] = set()
    kept: list[Operator] = []
    for op in operators:
        if op.name in names and op.name != SHARED_NAME:
            raise ConfigError(source, f"two operators are named {op.name!r}")
        if op.token in tokens:
            raise ConfigError(source, f"operator {op.name!r} has the token of another operator")
        names.add(op.name)
        tokens.add(op.token)
        kept.append(op)
    return tuple(kept)


def identify(operators: Iterable[Operator], token: str | None) -> Operator | None:
    """The operator whose token is `token`, compared in constant time against every one (neither
    the match nor its position shows in the time taken); None when none matches."""
    if not token:
        return None
    given = token.encode("utf-8", "surrogatepass")
    found: Operator | None = None
    for op in operators:
        if hmac.compare_digest(given, op.token.encode("utf-8", "surrogatepass")) and not found:
            found = op
    return found


def identity_of(op: Operator) -> Identity:
    return Identity(op.name, op.role, named=op.name != SHARED_NAME)


HEADER = re.compile(r"[A-Za-z0-9-]{1,100}")


def header_name(field: str, value: str) -> str:
    """A trusted header's name, lower-cased as ASGI gives headers; ConfigError when invalid."""
    if not HEADER.fullmatch(value):
        raise ConfigError(field, "a header name is 1 to 100 letters, digits or dashes")
    return value.lower()


def role(field: str, value: str) -> Role:
    if value not in ROLES:
        raise ConfigError(field, "a role is read or operate")
    return value
