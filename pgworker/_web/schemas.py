"""The request bodies and URL numbers of the HTTP API: one set of typed models behind both the
validation and the OpenAPI document, so that the document is the contract the server keeps. The
bounds written here are those of _validate.py (and operations.py); pgworker's own validators (the
ones the Python API and the CLI use) then check what a schema cannot say: lone surrogates, JSON
nested more than MAX_DEPTH deep or past MAX_PAYLOAD_BYTES, a `run_at` that overflows once in UTC.

Integers: a JSON number without a fraction is an integer (JSON Schema counts `3.0` as the
integer 3, and so does JSON's number model), so an integer field takes `3` and `3.0` alike and
refuses `3.5`, `"3"` and `true`. A number in a URL (a job id, `limit`, `before`) is ASCII digits
only (validate.whole): no `+`, spaces, `1.0`, `1_0` or non-ASCII digits."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from annotated_types import Interval, MinLen
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    TypeAdapter,
    WithJsonSchema,
    create_model,
)
from pydantic_core import PydanticCustomError

from .. import _validate as validate
from .._filters import MAX_ERROR_TEXT, MAX_IDS
from ..errors import ValidationError
from ..models import ENQUEUE_OPTIONS, JobStatus
from ..operations import MAX_ACTOR_LENGTH, MAX_REASON_LENGTH

if TYPE_CHECKING:
    from ..registry import Registry

NO_NUL = r"^[^\x00]*$"
"""Text PostgreSQL can store: no NUL character."""


def _integral(value: Any) -> Any:
    """`3.0` read as 3: the same integer to JSON Schema and to JSON's number model."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _decimal(value: Any) -> Any:
    """A number from a URL: ASCII digits only, as the dashboard and the CLI read them."""
    if isinstance(value, str):
        try:
            return validate.whole(value)
        except ValueError:
            raise PydanticCustomError(
                "whole_number", "must be a whole number in ASCII digits"
            ) from None
    return value


def _real(value: Any) -> Any:
    """A number of seconds from a URL: a decimal number in ASCII digits (`2`, `0.5`)."""
    if isinstance(value, str):
        try:
            return validate.real(value)
        except ValueError:
            raise PydanticCustomError(
                "number", "must be a number of seconds in ASCII digits, e.g. 10 or 0.5"
            ) from None
    return value


def _id(value: Any) -> Any:
    """A job's id in a URL: `_decimal`'s digits, without a leading zero (`01` would be a second
    spelling of job 1, which the README refuses)."""
    if isinstance(value, str) and value.lstrip("-")[:1] == "0" and value.lstrip("-") != "0":
        raise PydanticCustomError(
            "whole_number", "must be a whole number in ASCII digits, without leading zeros"
        )
    return _decimal(value)


RUN_AT = (
    r"^(?!0001-01-01[Tt][0-9:.]*\+(?!00:?00)|9999-12-31[Tt][0-9:.]*-(?!00:?00))"
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt]"
)
"""A `run_at` as text: an RFC 3339 date and time (a `T` between them; not a number of seconds),
and one that stays within years 1 to 9999 once in UTC (what Python and jsonb's readers hold),
said as a pattern: on the calendar's first day no positive offset, on its last day no negative
one. The server checks the text with this same pattern, then the exact instant."""
_RUN_AT = re.compile(RUN_AT)


def _run_at(value: Any) -> Any:
    if not isinstance(value, str) or not _RUN_AT.match(value):
        raise PydanticCustomError(
            "run_at",
            "must be an RFC 3339 date and time within years 1 to 9999 in UTC, e.g. "
            "2030-01-01T09:00:00Z (on 0001-01-01 or 9999-12-31, write it in UTC)",
        )
    return value


Integral = BeforeValidator(_integral)
Decimal = BeforeValidator(_decimal)

Seconds = Annotated[StrictFloat, Interval(ge=0, le=validate.MAX_DELAY)]
"""Seconds: a JSON number (not a string, not a boolean)."""
Lease = Annotated[StrictFloat, Interval(gt=0, le=validate.MAX_LEASE)]
Int = Annotated[StrictInt, Interval(ge=0, le=validate.MAX_INT), Integral]
Positive = Annotated[StrictInt, Interval(ge=1, le=validate.MAX_INT), Integral]
JobId = Annotated[StrictInt, Interval(ge=1, le=validate.MAX_BIGINT), Integral]
MAX_JSON_ID = 2**53 - 1
"""The largest job id a JSON body names (`after`): the largest integer every JSON reader holds
exactly (a validator comparing as doubles would take 2**63 + 191 for 2**63 - 1)."""
BodyJobId = Annotated[StrictInt, Interval(ge=1, le=MAX_JSON_ID), Integral]
PriorityInt = Annotated[StrictInt, Interval(ge=validate.MIN_INT, le=validate.MAX_INT), Integral]
MAX_WAIT = 60.0
"""The longest long poll of GET /jobs/{id}?wait=, in seconds."""
WaitSeconds = Annotated[float, Interval(gt=0, le=MAX_WAIT), BeforeValidator(_real)]
"""GET /jobs/{id}?wait=: more than 0 and at most MAX_WAIT seconds."""
UrlId = Annotated[int, Interval(ge=1, le=validate.MAX_BIGINT), BeforeValidator(_id)]
"""A job's id in a URL."""
TypeName = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=validate.MAX_TYPE_LENGTH, pattern=NO_NUL)
]
QueueName = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=validate.MAX_QUEUE_LENGTH, pattern=NO_NUL)
]
EventName = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=validate.MAX_EVENT_NAME, pattern=NO_NUL)
]
WorkerId = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=validate.MAX_WORKER_ID_LENGTH, pattern=NO_NUL),
]
Key = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=validate.MAX_IDEMPOTENCY_KEY_LENGTH, pattern=NO_NUL),
]
Correlation = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=validate.MAX_CORRELATION_ID_LENGTH, pattern=NO_NUL),
]
ConcurrencyKey = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=validate.MAX_CONCURRENCY_KEY_LENGTH, pattern=NO_NUL),
]
UniqueKey = Annotated[
    StrictStr,
    StringConstraints(min_length=1, max_length=validate.MAX_UNIQUE_KEY_LENGTH, pattern=NO_NUL),
]
UniqueStates = Annotated[
    list[Literal["pending", "running", "completed", "failed", "cancelled"]],
    WithJsonSchema(
        {
            "type": "array",
            "items": {"enum": ["pending", "running", "completed", "failed", "cancelled"]},
            "allOf": [{"contains": {"const": "pending"}}, {"contains": {"const": "running"}}],
        }
    ),
]
Period = Annotated[StrictFloat, Interval(ge=validate.MIN_UNIQUE_PERIOD, le=validate.MAX_DELAY)]
Actor = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=MAX_ACTOR_LENGTH, pattern=NO_NUL)
]
Reason = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=MAX_REASON_LENGTH, pattern=NO_NUL)
]
RunAt = Annotated[
    AwareDatetime,
    BeforeValidator(_run_at),
    WithJsonSchema({"type": "string", "format": "date-time", "pattern": RUN_AT}),
]
Label = Annotated[StrictStr, StringConstraints(pattern="^(low|medium|high|critical)$")]
JSON_VALUE = "JsonValue"
_JSON_MARK = "x-pgworker-json-value"
JsonValue = Annotated[Any, WithJsonSchema({_JSON_MARK: True})]
"""Any JSON value jsonb stores: validated by enqueue's own checks (any depth, without a recursive
model), described by JSON_SCHEMA (a reference that `complete` puts in place of the mark)."""


EventData = Annotated[
    Any,
    WithJsonSchema(
        {
            _JSON_MARK: True,
            "description": "the event's data: any JSON without NUL characters (none: null)",
        }
    ),
]
"""POST /events/{name}'s body: a JsonValue, with its description (its schema replaces the
field's, and a description given to Body() with it)."""


JsonObject = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {_JSON_MARK: True},
        }
    ),
]
"""A JSON object jsonb stores (no NUL in its keys or strings): what a stored payload can contain."""

JSON_SCHEMA: dict[str, Any] = {
    "description": "any JSON value without a NUL character in its strings or keys (jsonb cannot "
    f"store one), nested at most {validate.MAX_DEPTH} deep",
    "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": {"$ref": f"#/components/schemas/{JSON_VALUE}"}},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"$ref": f"#/components/schemas/{JSON_VALUE}"},
        },
    ],
}


VersionList = Annotated[list[Positive], MinLen(1)]
Versions = Annotated[
    dict[TypeName, VersionList],
    # pydantic writes a key's pattern as patternProperties, which lets other keys through.
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": TypeAdapter(TypeName).json_schema(),
            "additionalProperties": TypeAdapter(VersionList).json_schema(),
        }
    ),
]


class _Body(BaseModel):
    """A body whose unknown keys are refused, naming them: a typo is never silently ignored."""

    model_config = ConfigDict(extra="forbid")


_AFTER_RULES: list[dict[str, Any]] = [
    {
        "required": ["after", "run_at"],
        "properties": {"after": {"type": "array"}, "run_at": {"type": "string"}},
    },
    {
        "required": ["after", "delay"],
        "properties": {"after": {"type": "array"}, "delay": {"type": "number"}},
    },
    {
        "required": ["on_parent_failure"],
        "properties": {"on_parent_failure": {"type": "string"}},
        "not": {"required": ["after"], "properties": {"after": {"type": "array"}}},
    },
]
"""The bodies enqueue refuses for after=: with a schedule, and on_parent_failure without it."""


def _both(name: str, given: dict[str, Any], other: str) -> dict[str, Any]:
    """A JSON Schema matching a body that gives `name` (so) and `other` (a string)."""
    return {"required": [name, other], "properties": {name: given, other: {"type": "string"}}}


def _without_key(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema matching a body that gives `name` (so) without a unique_key."""
    return {
        "required": [name],
        "properties": {name: given},
        "not": {"required": ["unique_key"], "properties": {"unique_key": {"type": "string"}}},
    }


class _EnqueueRules(_Body):
    # enqueue() refuses run_at and delay together, and the unique arguments' combinations:
    # said here too (a body matching none of these; `allOf` holds the typed payloads' rules).
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "anyOf": [
                    {
                        "required": ["run_at", "delay"],
                        "properties": {"run_at": {"type": "string"}, "delay": {"type": "number"}},
                    },
                    _both("idempotency_key", {"type": "string"}, "unique_key"),
                    _both("after", {"type": "array"}, "unique_key"),
                    *_AFTER_RULES,
                    _without_key("unique_states", {"type": "array"}),
                    _without_key("unique_period", {"type": "number"}),
                    _without_key("replace", {"const": True}),
                    {
                        "required": ["unique_states"],
                        "properties": {
                            "unique_states": {
                                "type": "array",
                                "contains": {"enum": ["completed", "failed", "cancelled"]},
                            }
                        },
                        "not": {
                            "required": ["unique_period"],
                            "properties": {"unique_period": {"type": "number"}},
                        },
                    },
                ]
            },
        }
    )


Priority = PriorityInt | Label

OPTION_TYPES: dict[str, Any] = {
    "queue": QueueName,
    "priority": Priority,
    "max_retries": Int,
    "idempotency_key": Key,
    "correlation_id": Correlation,
    "run_at": RunAt,
    "delay": Seconds,
    "version": Positive,
    "concurrency_key": ConcurrencyKey,
    "after": Annotated[
        list[BodyJobId],
        Field(
            min_length=1, max_length=validate.MAX_PARENTS, json_schema_extra={"uniqueItems": True}
        ),
    ],
    "on_parent_failure": Annotated[
        StrictStr,
        StringConstraints(pattern=f"^({'|'.join(validate.PARENT_FAILURE_CHOICES)})$"),
    ],
    "unique_key": UniqueKey,
    "unique_states": UniqueStates,
    "unique_period": Period,
    "replace": StrictBool,
}
"""The JSON type of each enqueue option of POST /jobs, with the bounds its validator checks (so
that the document states them): the options themselves, their order and their help are
models.ENQUEUE_OPTIONS'."""


def _option_fields() -> dict[str, Any]:
    """EnqueueBody's fields for the enqueue options: each optional (null: its default)."""
    if list(OPTION_TYPES) != list(ENQUEUE_OPTIONS):
        raise TypeError(
            "schemas.OPTION_TYPES must give a JSON type to each of models.ENQUEUE_OPTIONS, in "
            f"its order: {list(ENQUEUE_OPTIONS)}"
        )
    return {
        name: (OPTION_TYPES[name] | None, Field(None, description=option.help))
        for name, option in ENQUEUE_OPTIONS.items()
    }


if TYPE_CHECKING:

    class EnqueueBody(_EnqueueRules):
        type: str
        payload: Any

        def __getattr__(self, name: str) -> Any: ...

else:
    EnqueueBody = create_model(
        "EnqueueBody",
        __base__=_EnqueueRules,
        __module__=__name__,
        __doc__="POST /jobs: a job's type, its payload and the options of pgworker.enqueue.",
        type=(TypeName, Field(description="the job type")),
        payload=(
            JsonValue,
            Field({}, description="any JSON value (default: {}, as enqueue's; null is {} too)"),
        ),
        **_option_fields(),
    )


class UpdateBody(_Body):
    # update_job needs at least one field to change, not null.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in ("run_at", "priority", "payload")
            ]
        }
    )

    run_at: RunAt | None = Field(None, description="ISO 8601 with a time zone")
    priority: (
        PriorityInt
        | Annotated[StrictStr, StringConstraints(pattern="^(low|medium|high|critical)$")]
        | None
    ) = Field(None, description="an int or one of low, medium, high, critical")
    payload: JsonValue | None = Field(None, description="the new payload (null: unchanged)")


class ClaimBody(_Body):
    worker_id: WorkerId = Field(description="who claims: shown in GET /workers")
    types: list[TypeName] | None = Field(None, min_length=1, description="default: any type")
    queues: list[QueueName] | None = Field(None, min_length=1, description="default: any queue")
    lease: Lease | None = Field(None, description="seconds held without a heartbeat (30)")
    versions: Versions | None = Field(
        None, description='payload versions claimed by type, e.g. {"resize": [1, 2]}'
    )


class AttemptBody(_Body):
    worker_id: WorkerId
    attempt: Positive = Field(description="the `attempt` of the claim's answer")


class HeartbeatBody(AttemptBody):
    lease: Lease | None = Field(None, description="seconds from now the lease ends (30)")


class CompleteBody(AttemptBody):
    result: JsonValue = Field(None, description="any JSON value, stored as the job's result")


class FailBody(AttemptBody):
    error: StrictStr = Field(description="what went wrong: `Type: message`, or any text")
    permanent: StrictBool = Field(False, description="fail now, without retries")
    retry_after: Seconds | None = Field(None, description="seconds until the retry")


class ReplayBody(_Body):
    by: Actor | None = Field(None, description="who replays (default: api)")
    reason: Reason | None = None


class QueueControlBody(_Body):
    by: Actor | None = Field(None, description="who pauses or resumes (default: api)")
    reason: Reason | None = Field(None, description="why, kept in the operator log")


RATE_UNITS = "s|sec|second|m|min|minute|h|hour|d|day"
RATE = f"(?:[1-9][0-9]{{0,3}}|{validate.MAX_RATE_COUNT})/(?:{RATE_UNITS})"
"""A rate as the API takes it: `validate.rate`'s text in one spelling (no spaces, no leading
zeros, a lower-case unit), so that the document says exactly which texts are taken."""


def _rate(value: Any) -> Any:
    if isinstance(value, str) and not re.fullmatch(RATE, value):
        raise PydanticCustomError(
            "rate",
            f"must be N/unit, N from 1 to {validate.MAX_RATE_COUNT} and a unit of s, m, h or d "
            "(e.g. 600/m)",
        )
    return value


RateText = Annotated[
    StrictStr,
    BeforeValidator(_rate),
    WithJsonSchema({"type": "string", "minLength": 3, "maxLength": 12, "pattern": f"^{RATE}$"}),
]


class QueueLimitBody(_Body):
    """A key left out leaves that limit as it is; null clears it; give at least one."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["max_running"]}, {"required": ["rate"]}]}
    )

    max_running: Positive | None = Field(
        None, description="the most of the queue's jobs running at once; null: no limit"
    )
    rate: RateText | None = Field(
        None,
        description=f"the most starts per period: N/s, N/m, N/h or N/d, N from 1 to "
        f"{validate.MAX_RATE_COUNT} (e.g. 600/m); null: no rate",
    )
    by: Actor | None = Field(None, description="who changes the limits (default: api)")
    reason: Reason | None = Field(None, description="why, kept in the operator log")


class Problem(BaseModel):
    """Every error: what was wrong and what to do; `field` names the input at fault."""

    error: str
    field: str | None = None


def _operation(method: str, path: str) -> str:
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def _held(attempt: str) -> dict[str, Any]:
    """The link parameters of an attempt's writes: the job's id, worker and attempt number."""
    return {
        "parameters": {"path.id": "$response.body#/id"},
        "requestBody": {
            "worker_id": "$response.body#/worker_id",
            "attempt": f"$response.body#/{attempt}",
        },
    }


def _links(*targets: tuple[str, str, str], attempt: str = "attempt") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, method, path in targets:
        found[name] = {"operationRef": _operation(method, path)}
        if path.endswith(("/heartbeat", "/complete", "/fail")):
            found[name].update(_held(attempt))
        elif path.startswith("/queues/"):
            found[name]["parameters"] = {"path.queue": "$response.body#/queue"}
        else:
            found[name]["parameters"] = {"path.id": "$response.body#/id"}
    return found


_GET = ("GetJob", "get", "/jobs/{id}")
_CANCEL = ("CancelJob", "post", "/jobs/{id}/cancel")
_REPLAY = ("ReplayJob", "post", "/jobs/{id}/replay")
_HEARTBEAT = ("Heartbeat", "post", "/jobs/{id}/heartbeat")
_COMPLETE = ("Complete", "post", "/jobs/{id}/complete")
_FAIL = ("Fail", "post", "/jobs/{id}/fail")
_PAUSE = ("PauseQueue", "post", "/queues/{queue}/pause")
_RESUME = ("ResumeQueue", "post", "/queues/{queue}/resume")
_LIMIT = ("LimitQueue", "post", "/queues/{queue}/limit")
LINKS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("post", "/jobs", "201"): _links(_GET, _CANCEL, _REPLAY),
    ("post", "/jobs", "200"): _links(_GET, _CANCEL, _REPLAY),
    ("post", "/jobs/claim", "200"): _links(_HEARTBEAT, _COMPLETE, _FAIL, _GET, _CANCEL),
    # A heartbeat's answer is the job: its running attempt is `attempts`.
    ("post", "/jobs/{id}/heartbeat", "200"): _links(_COMPLETE, _FAIL, attempt="attempts"),
    ("post", "/jobs/{id}/fail", "200"): _links(_REPLAY, _GET),
    ("post", "/jobs/{id}/cancel", "200"): _links(_REPLAY, _GET),
    ("post", "/jobs/{id}/replay", "200"): _links(_GET, _CANCEL),
    ("post", "/queues/{queue}/pause", "200"): _links(_RESUME, _LIMIT),
    ("post", "/queues/{queue}/resume", "200"): _links(_PAUSE, _LIMIT),
    ("post", "/queues/{queue}/limit", "200"): _links(_PAUSE, _RESUME),
}
"""The OpenAPI links between operations: a client (and schemathesis's stateful phase) follows a
job from its creation or claim to the routes that act on it, and a queue between its controls."""


PAYLOAD = "Payload_"
"""The prefix of the components holding each task's payload schema (`Payload_send-invoice`)."""


def _component(type: str, taken: dict[str, Any]) -> str:
    """The component name of `type`'s payload: the characters a component name may hold
    (letters, digits, `-` and `_`; not `.`, which separates a payload's nested types), and a
    number after it when two types come to the same name."""
    name = base = PAYLOAD + re.sub(r"[^A-Za-z0-9_-]", "_", type)
    n = 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def _payloads(document: dict[str, Any], registry: Registry) -> None:
    """Each task's payload schema as a component (its nested types as `Payload_<type>.<Name>`),
    and for each typed task a rule of EnqueueBody: a body of that type carries that payload."""
    components = document["components"]["schemas"]
    rules = []
    for task in registry:
        name = _component(task.name, components)
        if task.payload_type is None:
            components[name] = {"$ref": f"#/components/schemas/{JSON_VALUE}"}
            continue
        schema, nested = task.payload_type.openapi_schema(f"{name}.")
        components.update(nested)
        components[name] = schema
        then: dict[str, Any] = {"properties": {"payload": {"$ref": f"#/components/schemas/{name}"}}}
        try:  # left out, the payload is {}: required when {} is not one of the task's
            task.payload_type.check_json({}, "payload")
        except ValidationError:
            then["required"] = ["payload"]
        rules.append(
            {
                "if": {"properties": {"type": {"const": task.name}}, "required": ["type"]},
                "then": then,
            }
        )
    if rules:
        components["EnqueueBody"]["allOf"] = rules


def complete(document: dict[str, Any], registry: Registry | None = None) -> dict[str, Any]:
    """FastAPI's document with what it cannot generate: the JSON value schema and the links,
    and the payload schema of each task of `registry` (`serve --app`)."""
    document.setdefault("components", {}).setdefault("schemas", {})[JSON_VALUE] = JSON_SCHEMA
    if registry is not None:
        _payloads(document, registry)
    stack: list[Any] = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.pop(_JSON_MARK, False):
                node["$ref"] = f"#/components/schemas/{JSON_VALUE}"
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    for (method, path, status), links in LINKS.items():
        document["paths"][path][method]["responses"][status]["links"] = links
    return document


ErrorText = Annotated[
    StrictStr, StringConstraints(min_length=1, max_length=MAX_ERROR_TEXT, pattern=NO_NUL)
]
"""An error text searched for (GET /jobs?error=)."""


ErrorGroup = Annotated[
    StrictStr, StringConstraints(min_length=16, max_length=16, pattern=r"^([0-9a-f]{16})$")
]
"""A failure group's fingerprint (GET /failures): 16 lowercase hex digits."""


class FilterBody(_Body):
    """The filter of a bulk action: the query parameters of GET /jobs, as JSON (each left out
    for any)."""

    status: JobStatus | None = None
    queue: QueueName | None = None
    type: TypeName | None = Field(None, description="the types starting with this text")
    error: ErrorText | None = Field(None, description="last error holding this text (any case)")
    created_after: RunAt | None = Field(None, description="created at or after")
    created_before: RunAt | None = Field(None, description="created before")
    finished_after: RunAt | None = Field(None, description="finished at or after")
    finished_before: RunAt | None = Field(None, description="finished before")
    correlation_id: Correlation | None = None
    id: BodyJobId | None = None
    payload: JsonObject | None = Field(
        None, description='an object the payload contains, e.g. {"customer_id": 42}'
    )
    ids: list[BodyJobId] | None = Field(
        None,
        min_length=1,
        max_length=MAX_IDS,
        description=f"a selection: only the jobs of these ids (at least 1, at most {MAX_IDS})",
    )
    error_group: ErrorGroup | None = Field(
        None, description="the jobs whose latest error is of this failure group (GET /failures)"
    )


class BulkBody(_Body):
    """POST /jobs/actions/{kind}: the jobs matching `filter` (every job when it is empty)."""

    filter: FilterBody
    by: Actor | None = Field(None, description="who asks, recorded with each job (default: api)")
    reason: Reason | None = Field(
        None, description="why, kept with the action, in the operator log and each job's events"
    )


class RescheduleBody(BulkBody):
    """POST /jobs/actions/reschedule: the pending jobs matching `filter` run no sooner than
    `run_at`."""

    run_at: RunAt
