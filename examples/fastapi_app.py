"""A FastAPI application that runs a pgworker Worker in its own process and enqueues in its
requests (README, Frameworks, FastAPI). Run it (after `pgworker migrate`):

    PGWORKER_DSN=postgresql://app@db/app uvicorn examples.fastapi_app:app
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import asyncpg
from fastapi import FastAPI, HTTPException, Path, Request
from pydantic import BaseModel

import pgworker

registry = pgworker.Registry()


@registry.task("send-welcome", max_retries=5)
async def send_welcome(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    ctx.log.info("welcoming", email=payload["email"])
    return {"sent_to": payload["email"]}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    dsn = os.environ["PGWORKER_DSN"]
    async with (
        asyncpg.create_pool(dsn, min_size=1, max_size=10) as pool,
        pgworker.Worker(registry, dsn, concurrency=10),
    ):
        app.state.pool = pool
        yield
    # Leaving: the worker stops first (running jobs get its shutdown_timeout), then the pool.


app = FastAPI(lifespan=lifespan)


class Signup(BaseModel):
    email: str


@app.post("/signups", status_code=202)
async def signup(body: Signup, request: Request) -> dict[str, Any]:
    async with request.app.state.pool.acquire() as conn, conn.transaction():
        # ... your own writes on `conn`: the job commits with them, or not at all
        result = await pgworker.enqueue(
            conn, "send-welcome", {"email": body.email}, idempotency_key=f"welcome:{body.email}"
        )
    return {"job_id": result.job.id, "created": result.created}


JobId = Annotated[int, Path(ge=1, le=2**63 - 1)]  # a bigint id: anything else is a 422


@app.get("/jobs/{job_id}")
async def job_status(job_id: JobId, request: Request) -> dict[str, Any]:
    job = await pgworker.get_job(request.app.state.pool, job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    return {"id": job.id, "status": job.status, "result": job.result}
