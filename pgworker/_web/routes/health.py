"""GET /healthz: for load balancers and orchestrators, without a token."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ..._db.migrations import check_schema
from .. import guard
from ..answers import Health
from ..bounds import bounded
from ..schemas import Problem
from .common import Served

HEALTH_TIMEOUT = 5.0

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=Health,
    response_description="the database answers and its schema is current",
    responses={503: {"model": Problem, "description": "the database or its schema is not ready"}},
)
async def healthz(api: Served) -> JSONResponse:
    """200 when the database answers and the schema is current, else 503. No token."""
    try:
        async with bounded(
            api.pool(), api.queries, HEALTH_TIMEOUT, client_check=api.state.client_check
        ) as conn:
            await check_schema(conn, api.schema)
    except Exception as exc:
        return guard.problem(503, f"unhealthy: {type(exc).__name__}: {exc}")
    return JSONResponse({"status": "ok"})
