"""A user's FastAPI application with pgworker's console mounted under /admin/jobs on a DSN (the
console opens its own pool at its first request): the other recipe of
docs/operations/operators.md, for tests/test_bulk_runners.py (the DSN from
$PGWORKER_TEST_APP_DSN)."""

from __future__ import annotations

import os

from fastapi import FastAPI

from pgworker.web import create_app
from tests.apps.mounted import operators

app = FastAPI()
app.mount("/admin/jobs", create_app(os.environ["PGWORKER_TEST_APP_DSN"], operators=operators))


@app.get("/")
async def home() -> dict[str, str]:
    return {"app": "the user's own"}
