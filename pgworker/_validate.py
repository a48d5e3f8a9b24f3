"""What pgworker accepts and stores: the documented bounds, and the one set of validators that
`enqueue`, `enqueue_many`, `Settings`, `RetryPolicy`, `Retry` and the CLI all use.

Upper bounds exist so that a value accepted at the boundary can always be stored and claimed: a
type of 3,000 characters passes an INSERT but breaks every claim (btree row size), a delay of
1e13 seconds passes Python but overflows PostgreSQL's timestamps. Errors name the field and say
what is accepted.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, overload

from .errors import MAX_DELAY as MAX_DELAY
from .errors import ConfigError, ValidationError
from .errors import seconds as seconds

PRIORITY_LABELS: dict[str, int] = {"low": 0, "medium": 10, "high": 20, "critical": 30}
"""The priorities that have a name (higher runs first)."""

_WHOLE = re.compile(r"-?[0-9]+")
_REAL = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def whole(text: Any) -> int:
    """An integer written in ASCII digits, with an optional leading `-`: how every number
    typed by a person (a URL, a form, an argument, a variable) is read. `int()` also takes
    Arabic-Indic or fullwidth digits, `1_0` and spaces around, and `str.isdigit()` says yes to
    `²`, which `int()` then refuses. ValueError for anything else."""
    if not isinstance(text, str) or len(text) > 40 or not _WHOLE.fullmatch(text):
        raise ValueError(f"not a whole number in ASCII digits: {text!r}")
    return int(text)


def real(text: Any) -> float:
    """A decimal number in ASCII (`1`, `-0.5`, `2.5e3`), as `whole` reads integers: no `nan`,
    `inf`, `1_0` or non-ASCII digits. ValueError for anything else."""
    if not isinstance(text, str) or len(text) > 100 or not _REAL.fullmatch(text):
        raise ValueError(f"not a decimal number in ASCII digits: {text!r}")
    return float(text)


def _bytes_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name) or ""
    if not raw:
        return default
    try:
        value = whole(raw.strip())
    except ValueError:
        value = 0
    if not 1024 <= value <= 255 * 1024 * 1024:
        raise ConfigError(name, f"{raw!r} must be a number of bytes from 1024 to 267386880")
    return value


MAX_TYPE_LENGTH = 200
MAX_QUEUE_LENGTH = 63
MAX_IDEMPOTENCY_KEY_LENGTH = 500
MAX_CORRELATION_ID_LENGTH = 200
MAX_WORKER_ID_LENGTH = 200
MAX_PATH_LENGTH = 4096
MAX_DEPTH = 500
"""Nesting of a payload or result (PostgreSQL and Python's json both recurse on it): a payload
this deep is stored, claimed and read back (tests/test_payload_depth.py)."""
MAX_TYPED_DEPTH = 200
"""Nesting of a typed task's payload (a pydantic model, a dataclass or a TypedDict), whether
given as an instance or a dict: pydantic-core reads JSON at most about 200 deep (POST /jobs checks
a typed payload as JSON) and follows a recursive type at most 255 times, both fixed in its code;
past that it raises errors of its own, or a bare ValueError."""
MAX_PAYLOAD_BYTES = _bytes_from_env("PGWORKER_MAX_PAYLOAD_BYTES", 64 * 1024 * 1024)
"""UTF-8 size of a payload's or result's JSON text; PGWORKER_MAX_PAYLOAD_BYTES changes it (jsonb
itself refuses values near 256 MB)."""
MAX_LEASE = 86400.0
"""One day: the longest lease, and the longest shutdown grace."""
MAX_POLL_INTERVAL = 3600.0
MAX_CONCURRENCY = 10_000
MAX_INT = 2**31 - 1
MIN_INT = -(2**31)
MAX_BIGINT = 2**63 - 1

MAX_SCHEMA_LENGTH = 56
"""The schema's NOTIFY channels are named after it (`<schema>_cancel`), and PostgreSQL refuses a
channel name over 63 bytes: a longer schema could be migrated, but not enqueued into."""
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_SURROGATE = re.compile("[\ud800-\udfff]")
# A real NUL in JSON text is `\u0000` after an even number of backslashes; `\\u0000` is the
# harmless six-character text `\u0000`.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _bad(error: type[Exception], field: str, message: str) -> Exception:
    return error(field, message)


def has_surrogates(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def clean_text(text: str) -> str:
    """`text` made storable in a PostgreSQL text column: NUL shown as `\\x00`, lone surrogates
    replaced by U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if has_surrogates(text):
        text = _SURROGATE.sub("\ufffd", text)
    return text


@overload
def name(
    field: str,
    value: Any,
    max_length: int,
    *,
    required: Literal[True] = True,
    error: type[Exception] = ValidationError,
) -> str: ...
@overload
def name(
    field: str,
    value: Any,
    max_length: int,
    *,
    required: bool,
    error: type[Exception] = ValidationError,
) -> str | None: ...
def name(
    field: str,
    value: Any,
    max_length: int,
    *,
    required: bool = True,
    error: type[Exception] = ValidationError,
) -> str | None:
    """A non-empty string of at most `max_length` characters, without NUL or lone surrogates."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(error, field, f"must be a non-empty string, got {value!r}")
    if len(value) > max_length:
        raise _bad(
            error, field, f"must be at most {max_length} characters, got {len(value)} characters"
        )
    if "\x00" in value:
        raise _bad(error, field, "must not contain NUL characters")
    if has_surrogates(value):
        raise _bad(error, field, "must be valid Unicode (it holds a lone surrogate)")
    return value


def identifier(field: str, value: Any, *, error: type[Exception] = ValidationError) -> str:
    """A plain SQL identifier (the schema name: the only identifier put into SQL text)."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_SCHEMA_LENGTH
        or not _IDENTIFIER.fullmatch(value)
    ):
        raise _bad(
            error,
            field,
            f"must be a plain SQL identifier (a letter or _, then letters, digits or _, at most "
            f"{MAX_SCHEMA_LENGTH} in all), got {value!r}",
        )
    return value


def count(
    field: str,
    value: Any,
    *,
    minimum: int = 0,
    maximum: int = MAX_INT,
    error: type[Exception] = ValidationError,
) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise _bad(error, field, f"must be an int from {minimum} to {maximum}, got {value!r}")
    return value


def priority(field: str, value: Any, *, error: type[Exception] = ValidationError) -> int:
    """A priority: an int (higher runs first) or one of PRIORITY_LABELS; None is 0."""
    if value is None:
        return 0
    if isinstance(value, str):
        if value in PRIORITY_LABELS:
            return PRIORITY_LABELS[value]
        labels = ", ".join(PRIORITY_LABELS)
        raise _bad(error, field, f"unknown label {value!r}; use an int or one of {labels}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(error, field, f"must be an int or a label, got {value!r}")
    return count(field, value, minimum=MIN_INT, error=error)


def moment(field: str, value: Any, *, error: type[Exception] = ValidationError) -> datetime:
    """A timezone-aware datetime that exists in UTC (datetime's own range is narrower than
    PostgreSQL's, and a date near its ends may not survive the conversion)."""
    if not isinstance(value, datetime):
        raise _bad(error, field, f"must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise _bad(error, field, "must be timezone-aware, e.g. datetime.now(timezone.utc)")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise _bad(error, field, f"is out of range once in UTC, got {value!r}") from None
    return value


def run_at(value: Any, *, error: type[Exception] = ValidationError) -> datetime:
    """A job's run_at: a `moment`, one microsecond earlier when it is the last microsecond of
    year 9999 in UTC, which asyncpg would send as PostgreSQL's 'infinity': the run_at of a parked
    job (migrations 19 and 20), which nothing would ever release; one microsecond later when it
    is the first of year 1 in UTC, which asyncpg would send as '-infinity' (a claim's wait,
    claimed_at - run_at, then fails, and the producer with it, for every job of the queue).
    Every other time is kept."""
    when: datetime = moment("run_at", value, error=error)
    utc = when.astimezone(UTC).replace(tzinfo=None)
    if utc == datetime.max:
        return when - timedelta(microseconds=1)
    if utc == datetime.min:
        return when + timedelta(microseconds=1)
    return when


def clamp_delay(delay: float) -> float:
    """A computed delay made storable: NaN and negatives are 0, the rest capped at MAX_DELAY."""
    if not delay > 0:
        return 0.0
    return min(delay, MAX_DELAY)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists and dicts nest deeper than `limit`; iterative, so any depth is safe. One
    level at a time, keeping only the containers: the leaves cost a type check each."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if type(child) not in _LEAVES and isinstance(child, _CONTAINERS):
                    below.append(child)
        level = below
    return False


_CONTAINERS = (dict, list, tuple)
_LEAVES = frozenset({str, int, float, bool, type(None)})
"""The types most values are, told apart from a container without isinstance's cost."""


def json_problem(text: str, value: Any) -> str | None:
    """Why `text`, the compact JSON of `value`, cannot be stored as jsonb, or None. Cheap for
    ordinary values: each check runs its exact form only when a C-speed scan says it may fail."""
    if "\\u0000" in text and _JSON_NUL.search(text):
        return "must not contain NUL characters (jsonb cannot store them)"
    if not text.isascii() and _SURROGATE.search(text) is not None:
        return "must be valid Unicode (it holds a lone surrogate)"
    if len(text) > MAX_DEPTH and text.count("[") + text.count("{") > MAX_DEPTH and too_deep(value):
        return f"must not nest lists and objects more than {MAX_DEPTH} deep"
    if len(text) * 4 > MAX_PAYLOAD_BYTES and len(text.encode()) > MAX_PAYLOAD_BYTES:
        return (
            f"is {len(text.encode()):,} bytes as JSON, over the limit of {MAX_PAYLOAD_BYTES:,} "
            "(PGWORKER_MAX_PAYLOAD_BYTES)"
        )
    return None


MAX_CONCURRENCY_KEY_LENGTH = 200
MAX_RATE_COUNT = 10_000
"""The most starts a rate limit allows per period: the window keeps one timestamp per start."""
_RATE = re.compile(r"([0-9]{1,9})\s*/\s*([a-z]+)")
RATE_PERIODS = {
    "s": 1, "sec": 1, "second": 1,
    "m": 60, "min": 60, "minute": 60,
    "h": 3600, "hour": 3600,
    "d": 86400, "day": 86400,
}  # fmt: skip


class Rate(NamedTuple):
    """At most `starts` starts in any `period` seconds (a sliding window)."""

    starts: int
    period: int

    def __str__(self) -> str:
        unit = {1: "s", 60: "m", 3600: "h", 86400: "d"}[self.period]
        return f"{self.starts}/{unit}"


def rate(field: str, value: Any, *, error: type[Exception] = ValidationError) -> Rate:
    """A rate written `N/unit` (`10/s`, `600/m`, `1000/h`, `5000/d`; also `/second`, `/min`...),
    N from 1 to MAX_RATE_COUNT."""
    units = "s, m, h or d"
    if not isinstance(value, str):
        raise _bad(error, field, f"must be a rate such as '10/s' or '600/m', got {value!r}")
    found = _RATE.fullmatch(value.strip().lower())
    if found is None or found.group(2) not in RATE_PERIODS:
        raise _bad(
            error, field, f"must be N/unit with a unit of {units} (e.g. '10/s'), got {value!r}"
        )
    n = int(found.group(1))
    if not 1 <= n <= MAX_RATE_COUNT:
        raise _bad(error, field, f"must allow 1 to {MAX_RATE_COUNT:,} starts per period, got {n}")
    return Rate(n, RATE_PERIODS[found.group(2)])


def concurrency_key(value: Any, *, error: type[Exception] = ValidationError) -> str | None:
    """A job's concurrency key: None, or a non-empty string of at most 200 characters."""
    return name("concurrency_key", value, MAX_CONCURRENCY_KEY_LENGTH, required=False, error=error)


MAX_EVENT_NAME = 200
"""The longest event name (ctx.wait_for_event, pgworker.emit), in characters."""


def event_name(value: Any, *, error: type[Exception] = ValidationError) -> str:
    """An event's name: a non-empty string of at most MAX_EVENT_NAME characters, without NUL."""
    return name("name", value, MAX_EVENT_NAME, error=error)


def timeout(value: Any, *, error: type[Exception] = ValidationError) -> float | None:
    """A wait's timeout: None (none), or a number of seconds (or a timedelta) from 0."""
    return None if value is None else seconds("timeout", value, error=error)


MAX_PARENTS = 1000
PARENT_FAILURE_CHOICES = ("cancel", "run")


def parents(value: Any, *, error: type[Exception] = ValidationError) -> tuple[int, ...] | None:
    """A job's `after=`: None (or empty: no parents), else the parents' ids in ascending order,
    each a job id (a whole number from 1), none twice, at most MAX_PARENTS of them."""
    if value is None:
        return None
    if isinstance(value, str | bytes | dict) or not hasattr(value, "__iter__"):
        raise _bad(error, "after", f"must be a list of job ids, got {value!r}")
    ids = list(itertools.islice(value, MAX_PARENTS + 1))  # an endless iterable: refused
    if len(ids) > MAX_PARENTS:
        raise _bad(error, "after", f"must list at most {MAX_PARENTS:,} parents, got {len(ids):,}")
    for i in ids:
        if type(i) is not int or not 1 <= i <= MAX_BIGINT:
            raise _bad(error, "after", f"must hold job ids (whole numbers from 1), got {i!r}")
    unique = sorted(set(ids))
    if len(unique) != len(ids):
        seen: set[int] = set()
        twice = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
        raise _bad(error, "after", f"lists job {twice[0]} more than once: give each parent once")
    return tuple(unique) or None


def on_parent_failure(
    value: Any, after: tuple[int, ...] | None, *, error: type[Exception] = ValidationError
) -> str | None:
    """What a failed parent does: None when the job has no parents, else "cancel" (the default)
    or "run"; given without `after`, refused."""
    if value is not None and value not in PARENT_FAILURE_CHOICES:
        raise _bad(error, "on_parent_failure", f'must be "cancel" or "run", got {value!r}')
    if after is None:
        if value is not None:
            raise _bad(error, "on_parent_failure", "applies to a job with after=: give after= too")
        return None
    return value or "cancel"


MAX_UNIQUE_KEY_LENGTH = 200
UNIQUE_STATES = {"pending": 1, "running": 2, "completed": 4, "failed": 8, "cancelled": 16}
"""The bit of each state in `jobs.unique_states` (migration 17's unique_state_in)."""
DEFAULT_UNIQUE_STATES = 3
"""pending and running."""


def unique_key(value: Any, *, error: type[Exception] = ValidationError) -> str | None:
    """A job's unique key: None, or a non-empty string of at most 200 characters."""
    return name("unique_key", value, MAX_UNIQUE_KEY_LENGTH, required=False, error=error)


MIN_UNIQUE_PERIOD = 0.001


def unique_period(value: Any, *, error: type[Exception] = ValidationError) -> float | None:
    """A unique period: None, or a number of seconds (or a timedelta) > 0, at least a
    millisecond (shorter buckets are not measurable) and at most ten years."""
    if value is None:
        return None
    period = seconds("unique_period", value, zero=False, error=error)
    if period < MIN_UNIQUE_PERIOD:
        raise _bad(error, "unique_period", f"must be at least 0.001 seconds, got {value!r}")
    return period


def unique_states(
    value: Any, period: float | None, *, error: type[Exception] = ValidationError
) -> int:
    """The states a unique key is held in, as the bitmask stored (None: pending and running).
    They must hold pending and running (a job moves between them on retry, snooze and rescue:
    outside on one side, it would collide when it moves back), and a final state needs a
    period (else the key is held until the job is pruned)."""
    if value is None:
        return DEFAULT_UNIQUE_STATES
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise _bad(
            error,
            "unique_states",
            f"must be a list of states such as ('pending', 'running'), got {value!r}",
        )
    value = tuple(value)  # a generator is read once: the message below shows it too
    mask = 0
    for state in value:
        bit = UNIQUE_STATES.get(state) if isinstance(state, str) else None
        if bit is None:
            raise _bad(
                error,
                "unique_states",
                f"unknown state {state!r}; use pending, running, completed, failed, cancelled",
            )
        mask |= bit
    if mask & 3 != 3:
        raise _bad(
            error,
            "unique_states",
            "must contain both pending and running (a job moves between them on retry, snooze "
            f"and rescue), got {tuple(value)!r}",
        )
    if mask > 3 and period is None:
        raise _bad(
            error,
            "unique_states",
            "a final state (completed, failed, cancelled) needs a unique_period: else the key "
            "would be held until the job is pruned",
        )
    return mask
