"""A worker inside a FastAPI (or any ASGI) application: it serves while the application runs.

from fastapi import FastAPI
from examples.recipes.fastapi_lifespan import lifespan

app = FastAPI(lifespan=lifespan)
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pgworker
from examples.recipes.tasks import registry


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    dsn = os.environ["PGWORKER_DSN"]
    async with pgworker.Worker(registry, dsn):
        yield
