"""The Django settings of the example: the database from PGWORKER_DSN, the same database the
worker serves (its schema is created by `pgworker migrate`)."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit


def database(dsn: str) -> dict[str, str]:
    """Django's DATABASES entry for a postgresql:// DSN (a Unix socket may be in `?host=`)."""
    parts = urlsplit(dsn)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": query.get("host") or parts.hostname or "",
        "PORT": query.get("port") or str(parts.port or ""),
    }


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
INSTALLED_APPS = ["examples.django_app"]  # for its `manage.py pgworker` command
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "examples.django_app.urls"
DATABASES = {"default": database(os.environ.get("PGWORKER_DSN", "postgresql:///app"))}
USE_TZ = True
