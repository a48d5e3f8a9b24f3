"""The one filter of the job lists, shared by the dashboard (its query string),
`GET /jobs` (its query parameters), `pgworker jobs list` (its options) and the bulk actions (the
`filter` of their body, stored with the action): status, queue, type (a prefix), error text,
created and finished time ranges, correlation id, job id, a selection of ids and payload
containment.

`JobFilter.parse` reads one from text (a query string's values, a JSON body's), checking each
field and naming the wrong one in a ValidationError; `params` gives the values of the SQL
fragment sql/queries/_job_filter.sql; `query` the query string that shares it (the dashboard's
URL); `as_json` the object a bulk action stores and the API answers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _validate as validate
from . import settings
from .errors import ValidationError
from .models import JobStatus

MAX_ERROR_TEXT = 500
"""The most characters of an error text searched for."""
MAX_PAYLOAD_TEXT = 10_000
"""The most characters of a payload containment filter's JSON."""
MAX_IDS = 1000
"""The most job ids a selection (`ids`) names: what a person ticks on the pages, or a client
lists; more is a filter's work."""

FIELDS = (
    "status",
    "queue",
    "type",
    "error",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
    "correlation_id",
    "id",
    "payload",
    "ids",
    "error_group",
)
"""The filter's keys, in the order of the SQL fragment's parameters: the query parameters of
`GET /jobs` and of the dashboard's list, the keys of a bulk action's `filter`."""

_TIMES = ("created_after", "created_before", "finished_after", "finished_before")
_STATUSES = tuple(s.value for s in JobStatus)


@dataclasses.dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a list shows or a bulk action touches; None (every field's default) for any.

    `type` matches the types that start with it (`send` matches `send-invoice`); `error` the
    jobs whose last error holds it, in any letter case; the time ranges are half-open (`_after`
    inclusive, `_before` exclusive; a range that ends before it starts matches nothing);
    `payload` is JSON text of an object the job's payload
    contains (`{"customer_id": 42}` matches `{"customer_id": 42, "total": 9}`); `ids` a
    selection of at most MAX_IDS job ids (the jobs ticked on a page), sorted, each once;
    `error_group` the jobs whose latest error is of that failure group (GET /failures)."""

    status: str | None = None
    queue: str | None = None
    type: str | None = None
    error: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    correlation_id: str | None = None
    id: int | None = None
    payload: str | None = None
    ids: tuple[int, ...] | None = None
    error_group: str | None = None

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> JobFilter:
        """A filter from text values (a query string's, a form's, a JSON object's: `payload`
        may be an object there, `id` an int); an empty or blank value is no filter. Unknown
        keys and bad values are a ValidationError naming the key."""
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise ValidationError(
                unknown[0], f"is not a filter; the filters are {', '.join(FIELDS)}"
            )
        found: dict[str, Any] = {}
        for field in FIELDS:
            value = values.get(field)
            if isinstance(value, str):
                value = value.strip()
            if value is None or value == "":
                continue
            found[field] = _PARSERS[field](field, value)
        return cls.checked(**found)

    @classmethod
    def checked(cls, **fields: Any) -> JobFilter:
        """A filter from typed values (datetimes, an int id, a payload dict or JSON text),
        each checked as `parse` checks text."""
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ValidationError(
                unknown[0], f"is not a filter; the filters are {', '.join(FIELDS)}"
            )
        found: dict[str, Any] = {}
        for field, value in fields.items():
            if value is None:
                continue
            if field in _TIMES:
                found[field] = (
                    validate.moment(field, value)
                    if isinstance(value, datetime)
                    else _moment(field, value)
                )
            elif field == "id":
                found[field] = _id(field, value)
            elif field == "payload":
                found[field] = _payload(field, value)
            elif field == "ids":
                found[field] = _ids(field, value)
            else:
                found[field] = _PARSERS[field](field, value)
        return cls(**found)

    @property
    def empty(self) -> bool:
        return all(getattr(self, f) is None for f in FIELDS)

    def params(self) -> tuple[Any, ...]:
        """The values of sql/queries/_job_filter.sql's parameters $1 to $12: `id` and `ids`
        share $10, the ids a job may have (both given: the one id if the selection holds it,
        else none)."""
        ids: list[int] | None = None
        if self.ids is not None:
            ids = list(self.ids) if self.id is None else [i for i in self.ids if i == self.id]
        elif self.id is not None:
            ids = [self.id]
        return (
            self.status,
            self.queue,
            self.type,
            None if self.error is None else f"%{_like_escaped(self.error)}%",
            self.created_after,
            self.created_before,
            self.finished_after,
            self.finished_before,
            self.correlation_id,
            ids,
            self.payload,
            self.error_group,
        )

    def query(self) -> dict[str, str]:
        """The query string's values that give this filter back (times in ISO 8601)."""
        found: dict[str, str] = {}
        for field in FIELDS:
            value = getattr(self, field)
            if value is None:
                continue
            found[field] = _text(value)
        return found

    def as_json(self) -> dict[str, Any]:
        """The filter as a JSON object: the keys set, times in ISO 8601, the payload an
        object. `JobFilter.parse` reads it back."""
        found: dict[str, Any] = dict(self.query())
        if self.id is not None:
            found["id"] = self.id
        if self.payload is not None:
            found["payload"] = json.loads(self.payload)
        if self.ids is not None:
            found["ids"] = list(self.ids)
        return found

    def words(self) -> str:
        """The filter said in words, for a confirmation ("every job" when empty)."""
        parts = []
        for field in FIELDS:
            value = getattr(self, field)
            if value is None:
                continue
            if field == "ids":
                shown = ", ".join(map(str, value[:SHOWN_IDS]))
                more = len(value) - SHOWN_IDS
                selected = f"the {len(value):,} selected job{'s' if len(value) != 1 else ''}"
                parts.append(f"{selected} (ids {shown}{f' and {more:,} more' if more > 0 else ''})")
                continue
            parts.append(f"{_WORDS[field]} {_text(value)}")
        return ", ".join(parts) if parts else "every job"


SHOWN_IDS = 10
"""The most ids of a selection said in words (a confirmation)."""


def _text(value: Any) -> str:
    """A filter's value as its query string holds it (a selection: ids joined by commas)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


_WORDS = {
    "status": "status",
    "queue": "queue",
    "type": "type starting with",
    "error": "error containing",
    "created_after": "created from",
    "created_before": "created before",
    "finished_after": "finished from",
    "finished_before": "finished before",
    "correlation_id": "correlation id",
    "id": "id",
    "payload": "payload containing",
    "ids": "ids",
    "error_group": "failure group",
}


def _like_escaped(text: str) -> str:
    """`text` as a literal inside an ILIKE pattern (backslash is the escape character)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _status(field: str, value: Any) -> str:
    if value not in _STATUSES:
        raise ValidationError(field, f"must be one of {', '.join(_STATUSES)}, got {value!r}")
    return str(value)


def _name(max_length: int) -> Any:
    def check(field: str, value: Any) -> str:
        return validate.name(field, value, max_length)

    return check


def _id(field: str, value: Any) -> int:
    if isinstance(value, str):
        try:
            value = validate.whole(value)
        except ValueError:
            raise ValidationError(
                field, f"must be a job id in ASCII digits, got {value!r}"
            ) from None
    return validate.count(field, value, minimum=1, maximum=validate.MAX_BIGINT)


def _ids(field: str, value: Any) -> tuple[int, ...]:
    """A selection: ids separated by commas or spaces (a query string's, a form's), or a list of
    them (JSON); at least one, at most MAX_IDS, each a job id; sorted, each once."""
    if isinstance(value, str):
        if len(value) > MAX_IDS * 21:
            raise ValidationError(field, f"must name at most {MAX_IDS} job ids")
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, list | tuple) or not value:
        raise ValidationError(field, "must name at least one job id (select a job)")
    if len(value) > MAX_IDS:
        raise ValidationError(
            field, f"must name at most {MAX_IDS} job ids, got {len(value)}; use a filter instead"
        )
    return tuple(sorted({_id(field, v) for v in value}))


ERROR_GROUP_LENGTH = 16
"""The hex digits of an error's group (migration 30's error_group function)."""


def _error_group(field: str, value: Any) -> str:
    """A failure group's fingerprint: 16 lowercase hex digits, as GET /failures gives it."""
    if (
        not isinstance(value, str)
        or len(value) != ERROR_GROUP_LENGTH
        or any(c not in "0123456789abcdef" for c in value)
    ):
        raise ValidationError(
            field, f"must be a failure group's fingerprint (16 hex digits), got {value!r}"
        )
    return value


def _moment(field: str, value: Any) -> datetime:
    """An ISO 8601 time with a time zone, or a duration back from now (`15m`, `2h`, `7d`)."""
    if isinstance(value, datetime):
        return validate.moment(field, value)
    if not isinstance(value, str) or len(value) > 100:
        raise ValidationError(field, f"must be an ISO 8601 time with a time zone, got {value!r}")
    try:
        return datetime.now(UTC) - timedelta(seconds=settings.duration(field, value))
    except ValidationError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValidationError(
            field,
            "must be an ISO 8601 time with a time zone such as 2030-01-01T09:00:00+00:00, or a "
            f"duration back from now such as 15m, 2h or 7d, got {value!r}",
        ) from None
    if moment.tzinfo is None:
        raise ValidationError(field, f"{value!r} has no time zone; add one, e.g. {value}+00:00")
    return validate.moment(field, moment)


def _payload(field: str, value: Any) -> str:
    """JSON text of an object (from text, or from a dict), compact."""
    if isinstance(value, str):
        if len(value) > MAX_PAYLOAD_TEXT:
            raise ValidationError(
                field, f"must be at most {MAX_PAYLOAD_TEXT} characters of JSON, got {len(value)}"
            )
        try:
            value = json.loads(value)
        except RecursionError:
            raise ValidationError(field, "nests too deep") from None
        except ValueError as exc:
            raise ValidationError(
                field, f'must be a JSON object, such as {{"id": 42}}: {exc}'
            ) from None
    if not isinstance(value, dict):
        raise ValidationError(field, f'must be a JSON object, such as {{"id": 42}}, got {value!r}')
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (RecursionError, ValueError, TypeError) as exc:
        raise ValidationError(field, f"cannot be JSON: {exc}") from None
    if len(text) > MAX_PAYLOAD_TEXT:
        raise ValidationError(field, f"must be at most {MAX_PAYLOAD_TEXT} characters of JSON")
    if "\\u0000" in text:
        raise ValidationError(field, "must not contain NUL characters")
    return validate.name(field, text, MAX_PAYLOAD_TEXT)


_PARSERS: dict[str, Any] = {
    "status": _status,
    "queue": _name(validate.MAX_QUEUE_LENGTH),
    "type": _name(validate.MAX_TYPE_LENGTH),
    "error": _name(MAX_ERROR_TEXT),
    "created_after": _moment,
    "created_before": _moment,
    "finished_after": _moment,
    "finished_before": _moment,
    "correlation_id": _name(validate.MAX_CORRELATION_ID_LENGTH),
    "id": _id,
    "payload": _payload,
    "ids": _ids,
    "error_group": _error_group,
}
