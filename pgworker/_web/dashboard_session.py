"""The dashboard's browser sessions and CSRF tokens, signed with HMAC-SHA256 under a secret drawn
at random when the server starts (a restart logs everyone out; no new dependency, no table).

A session cookie is `<payload>.<signature>`, the payload a base64 JSON object: a random session
id, whether the browser logged in with a token (a login form gets an anonymous session first, so
that its POST carries a CSRF token too), and when it expires. A form's CSRF token is an HMAC of
the session id: a page of another origin can neither read it nor forge it. A flash message (what
a button did, shown once by the page it redirects to) is signed the same way, so that a link
cannot make the dashboard claim something happened."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

SESSION_COOKIE = "pgworker_session"
FLASH_COOKIE = "pgworker_flash"
"""The cookies' names begin so; each console ends them with its own part (`cookie_name`)."""
SESSION_LIFETIME = 12 * 3600
"""Seconds a login lasts."""
FLASH_LIFETIME = 60
MAX_COOKIE = 4096
"""A longer cookie is not ours: refused before it is decoded."""


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    authenticated: bool
    expires: int
    operator: str | None = None
    """The name of the operator who logged in (None: not logged in, or a shared token)."""
    role: str = "operate"
    """The role of the operator who logged in: `read` or `operate`."""


def cookie_name(base: str, host: str, root: str) -> str:
    """`base` followed by a part of this console's own: a hash of the host and port the browser
    addressed it by (its Host header) and the path it is mounted under. A browser sends a host's
    cookies to every port of it, and a console's at `/` to one mounted under `/admin/jobs` too:
    two consoles sharing one name would overwrite each other's session (a login to one logging
    out of the other, its forms "expired"). The name stays the same across restarts of a console
    at the same address, so a restarted one replaces its old cookie rather than adding one."""
    digest = hashlib.sha256(f"{host.strip().lower()}\n{root}".encode()).hexdigest()[:10]
    return f"{base}_{digest}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and checks the dashboard's cookies and tokens under one server's secret."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def _mac(self, purpose: str, text: str) -> str:
        message = f"{purpose}\n{text}".encode()
        return _b64(hmac.new(self._secret, message, hashlib.sha256).digest())

    def _seal(self, purpose: str, value: dict[str, Any]) -> str:
        payload = _b64(json.dumps(value, separators=(",", ":")).encode())
        return f"{payload}.{self._mac(purpose, payload)}"

    def _open(self, purpose: str, cookie: str | None) -> dict[str, Any] | None:
        if not cookie or len(cookie) > MAX_COOKIE or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        if not hmac.compare_digest(signature.encode(), self._mac(purpose, payload).encode()):
            return None
        try:
            value = json.loads(_unb64(payload))
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("exp"), int):
            return None
        return value if value["exp"] > time.time() else None

    def new_session(
        self, authenticated: bool, operator: str | None = None, role: str = "operate"
    ) -> tuple[Session, str]:
        """A fresh session (a new id: a login never keeps the id it was given before) and its
        cookie value; `operator` and `role`: who logged in (signed with the rest)."""
        session = Session(
            secrets.token_urlsafe(18),
            authenticated,
            int(time.time()) + SESSION_LIFETIME,
            operator,
            role,
        )
        value = {
            "sid": session.sid,
            "auth": authenticated,
            "exp": session.expires,
            "op": operator,
            "role": role,
        }
        return session, self._seal("session", value)

    def session(self, cookie: str | None) -> Session | None:
        """The session a cookie holds; None when it is missing, forged, altered or expired."""
        value = self._open("session", cookie)
        if value is None or not isinstance(value.get("sid"), str):
            return None
        operator, role = value.get("op"), value.get("role")
        return Session(
            value["sid"],
            value.get("auth") is True,
            value["exp"],
            operator if isinstance(operator, str) else None,
            "operate" if role == "operate" else "read",
        )

    def csrf(self, session: Session) -> str:
        """The CSRF token of the forms of `session`'s pages."""
        return self._mac("csrf", session.sid)

    def csrf_ok(self, session: Session | None, token: object) -> bool:
        if session is None or not isinstance(token, str) or len(token) > 100:
            return False
        return hmac.compare_digest(token.encode(), self.csrf(session).encode())

    def flash(self, session: Session, kind: str, text: str) -> str:
        """A message for the next page of `session` only."""
        value = {"sid": session.sid, "kind": kind, "text": text}
        return self._seal("flash", {**value, "exp": int(time.time()) + FLASH_LIFETIME})

    def read_flash(self, session: Session, cookie: str | None) -> tuple[str, str] | None:
        value = self._open("flash", cookie)
        if value is None or value.get("sid") != session.sid:
            return None
        kind, text = value.get("kind"), value.get("text")
        return (kind, text) if isinstance(kind, str) and isinstance(text, str) else None
