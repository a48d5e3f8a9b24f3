"""A user's FastAPI application with pgworker's dashboard mounted under /admin/jobs (the recipe of
docs/operations/dashboard.md), for tests/test_mounted.py: the DSN from $PGWORKER_TEST_APP_DSN."""

from __future__ import annotations

import os

from fastapi import FastAPI

from pgworker.web import Operator, create_app

TOKEN = "alice-token-0123456789"

app = FastAPI()


@app.get("/")
async def home() -> dict[str, str]:
    return {"app": "the user's own"}


app.mount(
    "/admin/jobs",
    create_app(
        os.environ["PGWORKER_TEST_APP_DSN"],
        operators=[
            Operator("alice", TOKEN, "operate"),
            Operator("reader", "reader-token-0123456789", "read"),
        ],
    ),
)
