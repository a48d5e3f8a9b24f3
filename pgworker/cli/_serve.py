"""serve: the HTTP API and the dashboard (the `web` extra)."""

from __future__ import annotations

import argparse
import os
import re
from typing import TYPE_CHECKING, cast

from .. import _bulk as bulk
from .. import _validate as validate
from .._db.connection import create_pool
from .._db.migrations import check_direct, check_schema
from .._logs import LEVELS, LogFormat, configure_logging
from .._version import DISTRIBUTION
from ..errors import ConfigError, PgWorkerError
from ..settings import Settings, default_worker_id
from ._common import (
    LOG_FORMATS,
    _command,
    _connect,
    _dsn,
    _from_env,
    _load,
    _Parser,
    _pooler,
    _schema,
    integer,
)

if TYPE_CHECKING:
    from .._web.operators import Operator

_BODY_LIMIT = 1024 * 1024


def add(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    srv = _command(
        sub,
        "serve",
        [common],
        "the HTTP API and the web dashboard",
        "Serve the HTTP API (OpenAPI document at /openapi.json) and the dashboard at / until "
        "SIGTERM or SIGINT. Every route but /healthz needs `Authorization: Bearer TOKEN`, "
        "TOKEN one of --token or $PGWORKER_API_TOKEN; serve refuses to start without a token "
        "unless --insecure-no-auth. It also takes part in the election of the maintenance "
        "leader, which rescues expired leases and prunes finished jobs (--no-maintenance to opt "
        "out). Needs the web extra: pip install 'pgworker-queue[web]'.",
        [
            "PGWORKER_API_TOKEN=s3cret pgworker serve",
            "pgworker serve --host 0.0.0.0 --port 9000 --token s3cret --read-only",
            "PGWORKER_API_TOKEN=old-token,new-token pgworker serve    # both accepted",
            "PGWORKER_API_TOKEN=s3cret pgworker serve --app app.handlers",
        ],
    )
    srv.add_argument(
        "--app",
        metavar="MODULE[:ATTR]",
        help="the module holding a pgworker.Registry, loaded as `pgworker run` loads its "
        "MODULE[:ATTR]: POST /jobs of its types gets each task's defaults and typed payloads "
        "checked (422), and /openapi.json lists each type's payload schema (default: none)",
    )
    srv.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on; 0.0.0.0 for every interface, e.g. in a container "
        "(default: 127.0.0.1)",
    )
    srv.add_argument(
        "--port", type=integer, default=8080, help="the TCP port, 1 to 65535 (default: 8080)"
    )
    srv.add_argument(
        "--token",
        dest="tokens",
        action="append",
        metavar="TOKEN",
        help="a bearer token clients must send; repeat for several. The tokens of "
        "$PGWORKER_API_TOKEN (comma-separated: old,new while rotating) are accepted as well; "
        "prefer the variable, a command line is visible to every user of the host "
        "(default: $PGWORKER_API_TOKEN; required unless --insecure-no-auth)",
    )
    srv.add_argument(
        "--tokens-file",
        metavar="PATH",
        help="named operators, one `name:token:role` a line (role read or operate; blank lines "
        "and # comments skipped): each logs in and sends `Bearer TOKEN` under its name, which "
        "the operator log records; a read operator changes nothing (403). $PGWORKER_TOKENS "
        "holds the same, entries separated by commas or newlines (default: none)",
    )
    srv.add_argument(
        "--trusted-user-header",
        metavar="HEADER",
        help="trust the user a reverse proxy names in this header (e.g. X-Forwarded-User): "
        "only behind a proxy that authenticates every request and removes the header from what "
        "clients send, or anyone can claim any name (default: no header trusted)",
    )
    srv.add_argument(
        "--trusted-user-role",
        choices=("read", "operate"),
        default="read",
        help="the role of a user named by --trusted-user-header (default: read)",
    )
    srv.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="accept requests without a token: only on a trusted network (default: off)",
    )
    srv.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every write (enqueue, claim, heartbeat, complete, fail, cancel, replay) "
        "with 405, and take no part in maintenance (it writes: rescue, pruning) (default: off)",
    )
    srv.add_argument(
        "--no-maintenance",
        dest="maintenance",
        action="store_false",
        help="take no part in the maintenance election: leave rescue and pruning to "
        "`pgworker run` (default: take part)",
    )
    srv.add_argument(
        "--body-limit",
        type=integer,
        metavar="BYTES",
        default=_BODY_LIMIT,
        help=f"the largest request body accepted, in bytes; a larger one is refused with 413 "
        f"(default: {_BODY_LIMIT} = 1 MB)",
    )
    srv.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="json or console, on stderr (default: $PGWORKER_LOG_FORMAT, else console)",
    )
    srv.add_argument(
        "--log-level",
        choices=list(LEVELS),
        help="the lowest level logged (default: $PGWORKER_LOG_LEVEL, else info)",
    )
    srv.set_defaults(perform=_serve)


_TOKEN = re.compile(r"[!-~]{1,1000}")
"""A token: visible ASCII but the comma (it separates tokens in $PGWORKER_API_TOKEN)."""


def _tokens(args: argparse.Namespace) -> tuple[str, ...]:
    """Every token of --token and $PGWORKER_API_TOKEN, each checked."""
    given = [("--token", t) for t in args.tokens or ()]
    env = os.environ.get("PGWORKER_API_TOKEN", "")
    given += [("PGWORKER_API_TOKEN", t.strip()) for t in env.split(",") if t.strip()]
    for field, token in given:
        if not _TOKEN.fullmatch(token) or "," in token:
            raise ConfigError(
                field,
                "a token is 1 to 1000 visible ASCII characters, without spaces or commas",
            )
    return tuple(dict.fromkeys(t for _, t in given))


def _operators(args: argparse.Namespace) -> tuple[Operator, ...]:
    """The named operators of --tokens-file and $PGWORKER_TOKENS; a bad line is refused naming
    its source and number (never its token)."""
    from .._web.operators import parse, unique

    found: list[Operator] = []
    if args.tokens_file is not None:
        try:
            # utf-8-sig: a file saved by an editor that starts it with a BOM reads the same
            with open(args.tokens_file, encoding="utf-8-sig") as f:
                text = f.read(1024 * 1024 + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("--tokens-file", f"cannot read it: {exc}") from None
        if len(text) > 1024 * 1024:
            raise ConfigError("--tokens-file", "over 1 MB: not a tokens file")
        found += parse(text, "--tokens-file")
    env = os.environ.get("PGWORKER_TOKENS", "")
    if env.strip():
        found += parse(env, "PGWORKER_TOKENS", separators=",\n")
    return unique(found, "--tokens-file and PGWORKER_TOKENS")


async def _serve(args: argparse.Namespace) -> int:
    level = args.log_level or _from_env("PGWORKER_LOG_LEVEL", list(LEVELS), "info")
    configure_logging(
        cast(
            LogFormat, args.log_format or _from_env("PGWORKER_LOG_FORMAT", LOG_FORMATS, "console")
        ),
        level,
    )
    validate.count("--port", args.port, minimum=1, maximum=65535)
    validate.count("--body-limit", args.body_limit, minimum=1)
    validate.name("--host", args.host, 253)
    tokens = _tokens(args)
    try:
        from .._web.config import WebConfig
        from .._web.operators import header_name
        from .._web.server import serve
    except ImportError as exc:
        missing = exc.name or "a dependency"
        raise PgWorkerError(
            f"serve needs the web extra ({missing} is missing): pip install '{DISTRIBUTION}[web]'"
        ) from None
    operators = _operators(args)
    header = None
    if args.trusted_user_header is not None:
        header = header_name("--trusted-user-header", args.trusted_user_header)
    if not tokens and not operators and header is None and not args.insecure_no_auth:
        raise ConfigError(
            "--token",
            "serve needs a token: set PGWORKER_API_TOKEN (or pass --token), name operators "
            "(--tokens-file, PGWORKER_TOKENS), or pass --insecure-no-auth to accept requests "
            "without one",
        )
    registry = None if args.app is None else _load(args.app)
    dsn, schema = _dsn(args), _schema(args)
    conn = await _connect(args, dsn)
    try:
        await check_schema(conn, schema)
    finally:
        await conn.close()
    pooler = _pooler(args)
    # The server's pool connects as its lifespan begins, where a refusal would only be logged:
    # one connection with the same options first, so that a pooler met without --pooler is one
    # line and exit status 2, as for every command.
    probe = await create_pool(dsn, size=1, application_name="pgworker:serve", pooler=pooler)
    try:
        if not pooler:
            await check_direct(probe, schema)
    finally:
        await probe.close()
    worker_id = f"serve-{default_worker_id()}"
    maintenance = args.maintenance and not args.read_only  # read-only: no write of any kind
    if maintenance:  # what maintenance reads from PGWORKER_*, checked before serving
        Settings.from_env(dsn=dsn, schema=schema, worker_id=worker_id)
    if not args.read_only:  # PGWORKER_BULK_LEASE, read by the runner of bulk actions
        bulk.lease()
    config = WebConfig(
        dsn=dsn,
        schema=schema,
        tokens=tokens,
        operators=operators,
        trusted_user_header=header,
        trusted_user_role=args.trusted_user_role,
        insecure_no_auth=args.insecure_no_auth,
        read_only=args.read_only,
        body_limit=args.body_limit,
        maintenance=maintenance,
        worker_id=worker_id,
        registry=registry,
        pooler=pooler,
    )
    await serve(config, args.host, args.port, log_level=level)
    return 0
