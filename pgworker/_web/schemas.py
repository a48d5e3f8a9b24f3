"""The request bodies of the HTTP API: one set of typed models behind both the validation and the
OpenAPI document. Types only: the bounds are checked by pgworker's own validators (_limits.py,
enqueue) in api.py, the same ones the Python API and the CLI use."""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

Number = StrictInt | float
"""Seconds: a JSON number (not a string, not a boolean)."""


class _Body(BaseModel):
    """A body whose unknown keys are refused, naming them: a typo is never silently ignored."""

    model_config = ConfigDict(extra="forbid")


class EnqueueBody(_Body):
    type: StrictStr = Field(description="the job type")
    payload: Any = Field(description="any JSON value")
    queue: StrictStr | None = Field(None, description="default: default")
    priority: StrictInt | StrictStr | None = Field(
        None, description="an int or one of low, medium, high, critical; higher runs first"
    )
    max_retries: StrictInt | None = Field(None, description="retries after the first attempt")
    idempotency_key: StrictStr | None = None
    correlation_id: StrictStr | None = Field(None, description="default: a new UUID")
    run_at: AwareDatetime | None = Field(None, description="ISO 8601 with a time zone")
    delay: Number | None = Field(None, description="seconds from now; not with run_at")
    version: StrictInt | None = Field(None, description="the payload's version (default 1)")


class ClaimBody(_Body):
    worker_id: StrictStr = Field(description="who claims: shown in GET /workers")
    types: list[StrictStr] | None = Field(None, description="default: any type")
    queues: list[StrictStr] | None = Field(None, description="default: any queue")
    lease: Number | None = Field(None, description="seconds held without a heartbeat (30)")
    versions: dict[StrictStr, list[StrictInt]] | None = Field(
        None, description='payload versions claimed by type, e.g. {"resize": [1, 2]}'
    )


class AttemptBody(_Body):
    worker_id: StrictStr
    attempt: StrictInt = Field(description="the `attempt` of the claim's answer")


class HeartbeatBody(AttemptBody):
    lease: Number | None = Field(None, description="seconds from now the lease ends (30)")


class CompleteBody(AttemptBody):
    result: Any = Field(None, description="any JSON value, stored as the job's result")


class FailBody(AttemptBody):
    error: StrictStr = Field(description="what went wrong: `Type: message`, or any text")
    permanent: StrictBool = Field(False, description="fail now, without retries")
    retry_after: Number | None = Field(None, description="seconds until the retry")


class ReplayBody(_Body):
    by: StrictStr | None = Field(None, description="who replays (default: api)")
    reason: StrictStr | None = None


class Problem(BaseModel):
    """Every error: what was wrong and what to do; `field` names the input at fault."""

    error: str
    field: str | None = None
