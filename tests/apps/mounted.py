"""A user's FastAPI application with pgworker's dashboard mounted under /admin/jobs: the recipe of
docs/operations/operators.md, for tests/test_mounted.py (the DSN from $PGWORKER_TEST_APP_DSN)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from fastapi import FastAPI

from pgworker.web import Operator, create_app

operators = [
    Operator("alice", "alice-token-0123456789", "operate"),
    Operator("reader", "reader-token-0123456789", "read"),
]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with asyncpg.create_pool(os.environ["PGWORKER_TEST_APP_DSN"]) as pool:
        app.mount("/admin/jobs", create_app(pool, operators=operators))
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/")
async def home() -> dict[str, str]:
    return {"app": "the user's own"}
