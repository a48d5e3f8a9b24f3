"""The request bodies of the HTTP API: one set of typed models behind both the validation and the
OpenAPI document. The bounds written here are those of _limits.py, so that the document says what
the server accepts; pgworker's own validators (the ones the Python API and the CLI use) then check
what a schema cannot say (NUL characters, lone surrogates, JSON that jsonb cannot store)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

from .. import _limits as limits

Seconds = Annotated[StrictInt | StrictFloat, Field(ge=0, le=limits.MAX_DELAY)]
"""Seconds: a JSON number (not a string, not a boolean)."""
Lease = Annotated[StrictInt | StrictFloat, Field(gt=0, le=limits.MAX_LEASE)]
Int = Annotated[StrictInt, Field(ge=0, le=limits.MAX_INT)]
Positive = Annotated[StrictInt, Field(ge=1, le=limits.MAX_INT)]
TypeName = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_TYPE_LENGTH)]
QueueName = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_QUEUE_LENGTH)]
WorkerId = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_WORKER_ID_LENGTH)]
Key = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_IDEMPOTENCY_KEY_LENGTH)]
Correlation = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_CORRELATION_ID_LENGTH)]


class _Body(BaseModel):
    """A body whose unknown keys are refused, naming them: a typo is never silently ignored."""

    model_config = ConfigDict(extra="forbid")


class EnqueueBody(_Body):
    type: TypeName = Field(description="the job type")
    payload: Any = Field(description="any JSON value")
    queue: QueueName | None = Field(None, description="default: default")
    priority: (
        Annotated[StrictInt, Field(ge=limits.MIN_INT, le=limits.MAX_INT)]
        | Annotated[StrictStr, Field(pattern="^(low|medium|high|critical)$")]
        | None
    ) = Field(None, description="an int or one of low, medium, high, critical; higher runs first")
    max_retries: Int | None = Field(None, description="retries after the first attempt (3)")
    idempotency_key: Key | None = None
    correlation_id: Correlation | None = Field(None, description="default: a new UUID")
    run_at: AwareDatetime | None = Field(None, description="ISO 8601 with a time zone")
    delay: Seconds | None = Field(None, description="seconds from now; not with run_at")
    version: Positive | None = Field(None, description="the payload's version (default 1)")


class ClaimBody(_Body):
    worker_id: WorkerId = Field(description="who claims: shown in GET /workers")
    types: list[TypeName] | None = Field(None, min_length=1, description="default: any type")
    queues: list[QueueName] | None = Field(None, min_length=1, description="default: any queue")
    lease: Lease | None = Field(None, description="seconds held without a heartbeat (30)")
    versions: dict[TypeName, list[Positive]] | None = Field(
        None, description='payload versions claimed by type, e.g. {"resize": [1, 2]}'
    )


class AttemptBody(_Body):
    worker_id: WorkerId
    attempt: Positive = Field(description="the `attempt` of the claim's answer")


class HeartbeatBody(AttemptBody):
    lease: Lease | None = Field(None, description="seconds from now the lease ends (30)")


class CompleteBody(AttemptBody):
    result: Any = Field(None, description="any JSON value, stored as the job's result")


class FailBody(AttemptBody):
    error: StrictStr = Field(description="what went wrong: `Type: message`, or any text")
    permanent: StrictBool = Field(False, description="fail now, without retries")
    retry_after: Seconds | None = Field(None, description="seconds until the retry")


class ReplayBody(_Body):
    by: WorkerId | None = Field(None, description="who replays (default: api)")
    reason: StrictStr | None = None


class Problem(BaseModel):
    """Every error: what was wrong and what to do; `field` names the input at fault."""

    error: str
    field: str | None = None
