"""`python manage.py pgworker ARGS...`: the `pgworker` command on Django's database, e.g.
`python manage.py pgworker migrate` or
`python manage.py pgworker run examples.django_app.handlers`."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from pgworker.cli import main


def dsn_of(alias: str = "default") -> str:
    db = settings.DATABASES[alias]
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    login = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = db.get("HOST") or "", str(db.get("PORT") or "")
    query = ""
    if host.startswith("/"):  # a Unix socket directory
        query, host = f"?host={quote(host, safe='')}", ""
    netloc = host + (f":{port}" if port and host else "")
    if port and not host:
        query += ("&" if query else "?") + f"port={port}"
    return f"postgresql://{login}{netloc}/{quote(db['NAME'], safe='')}{query}"


class Command(BaseCommand):
    help = "Run a pgworker command (run, migrate, status, ...) on Django's database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="+", help="the pgworker command and its arguments")
        parser.add_argument("--database", default="default", help="the DATABASES alias")

    def handle(self, *args: Any, **options: Any) -> None:
        command, *rest = args
        code = main([command, "--dsn", dsn_of(options["database"]), *rest])
        if code:
            raise SystemExit(code)
