"""A periodic schedule (`Registry.periodic`): its options checked at registration, and its slots,
computed from a clock the caller gives (so that a test sets the clock rather than waits).

Slots are timezone-aware datetimes in UTC. A cron schedule's come from cronsim, which follows
Debian's cron in every time zone, DST included (docs/guide/periodic.md says the rule); an `every`
schedule's are the multiples of its period since the Unix epoch, the same on every host whatever
its clock when it started."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from . import _validate as validate
from .errors import ConfigError

CatchUp = Literal["latest", "all", "none"]
CATCH_UPS: tuple[str, ...] = ("latest", "all", "none")
MAX_CATCH_UP = 1000
"""The most slots one pass enqueues for a schedule: with `catch_up="all"`, the most recent 1,000
of the missed ones (the older ones are skipped, and a log line says so)."""
MAX_NAME_LENGTH = 200
MAX_EVERY = 10 * 365 * 86400
"""Ten years: the longest `every`."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
"""The next slot of a cron expression that has none in the next 50 years."""
_SECOND = timedelta(seconds=1)
_BLANKS = re.compile(r"\s+")


def key(name: str, slot: datetime) -> str:
    """The idempotency key of a slot's job: `periodic:{name}:{slot in ISO 8601, UTC}`."""
    return f"periodic:{name}:{slot.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule of a registry: what to enqueue (a task's job, its payload, queue, priority
    and payload version) and when (`cron` in `timezone`, or `every` seconds)."""

    name: str
    task: str
    cron: str | None
    every: int | None
    timezone: str
    catch_up: CatchUp
    payload: str
    """The payload as JSON text, checked once at registration."""
    queue: str
    priority: int
    version: int

    @property
    def definition(self) -> str:
        """When it runs, in words, as `pgworker periodic list` and the `periodic` table show it:
        `cron 30 2 * * * Europe/Paris`, `every 60s`."""
        if self.cron is not None:
            return f"cron {self.cron} {self.timezone}"
        return f"every {self.every}s"

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after `moment`."""
        if self.every is not None:
            period = self.every * 1_000_000
            micros = (moment - _EPOCH) // timedelta(microseconds=1)
            return _EPOCH + timedelta(microseconds=(micros // period + 1) * period)
        assert self.cron is not None
        try:
            found = next(CronSim(self.cron, moment.astimezone(ZoneInfo(self.timezone))))
        except StopIteration:  # none in the 50 years cronsim looks ahead: none for now
            return NEVER
        return found.astimezone(UTC)

    def slots_back(self, since: datetime, until: datetime, limit: int) -> list[datetime]:
        """The slots from `since` (included) to `until` (included), the most recent first, at most
        `limit` of them."""
        if until < since:
            return []
        if self.every is not None:
            last = self.next_after(until) - timedelta(seconds=self.every)
            found: list[datetime] = []
            while last >= since and len(found) < limit:
                found.append(last)
                last -= timedelta(seconds=self.every)
            return found
        assert self.cron is not None
        # Backwards from `until` itself: cronsim steps back from the whole second below a
        # moment with microseconds, and from the second before one without.
        start = (until + timedelta(microseconds=1)).astimezone(ZoneInfo(self.timezone))
        found = []
        try:
            for slot in CronSim(self.cron, start, reverse=True):
                slot = slot.astimezone(UTC)
                if slot < since or len(found) >= limit:
                    break
                found.append(slot)
        except StopIteration:  # no slot in the 50 years cronsim looks back
            pass
        return found

    def due(self, cursor: datetime, now: datetime, grace: float) -> Due:
        """What one pass at `now` enqueues of the slots from `cursor` (the first not dealt with)
        to `now`. A slot less than `grace` seconds old is on time and enqueued under every
        policy; an older one was missed (no leader ran then): `catch_up` says which of those are
        enqueued ("all": every one, "latest": the most recent, "none": none). At most
        MAX_CATCH_UP slots in all, the most recent; `capped` says older ones were dropped."""
        found = self.slots_back(cursor, now, MAX_CATCH_UP + 1)
        capped = len(found) > MAX_CATCH_UP
        found = found[:MAX_CATCH_UP]
        on_time_from = now - timedelta(seconds=grace)
        on_time = [s for s in found if s >= on_time_from]
        missed = [s for s in found if s < on_time_from]
        if self.catch_up == "all":
            kept = missed
        elif self.catch_up == "latest":
            kept = missed[:1]
        else:
            kept = []
        slots = sorted(on_time + kept)
        return Due(slots, len(missed) - len(kept), capped and self.catch_up == "all")


@dataclass(frozen=True, slots=True)
class Due:
    """What a pass enqueues of a schedule: `slots` (oldest first), and how many missed slots
    its catch-up policy skipped; `capped` when more than MAX_CATCH_UP were due."""

    slots: list[datetime]
    skipped: int
    capped: bool


def set_name(schedules: Iterable[Schedule]) -> str:
    """The name of the lease that one worker of the fleet defining exactly `schedules` holds to
    enqueue them: `periodic:` and a hash of the set. Workers of one deploy share it; two fleets
    (or two versions in a rolling deploy) with other sets each elect their own."""
    described = sorted(
        (s.name, s.task, s.definition, s.catch_up, s.payload, s.queue, s.priority, s.version)
        for s in schedules
    )
    digest = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]
    return f"periodic:{digest}"


def check_cron(cron: Any, timezone: str) -> str:
    """`cron`, 5 fields or 6 (seconds first), checked by computing its next slot; blanks made
    single spaces (the expression is part of the schedule's stored definition)."""
    if not isinstance(cron, str) or not cron.strip():
        raise ConfigError("cron", f"must be a cron expression (a string), got {_shown(cron)}")
    expression = _BLANKS.sub(" ", cron.strip())
    fields = len(expression.split(" "))
    if fields not in (5, 6):
        raise ConfigError(
            "cron",
            f"{_shown(cron)} has {fields} field{'s' if fields > 1 else ''}; give 5 (minute hour "
            "day month weekday) or 6 (second minute hour day month weekday)",
        )
    try:
        next(CronSim(expression, datetime.now(ZoneInfo(timezone))))
    except CronSimError as exc:
        raise ConfigError("cron", f"{_shown(cron)} does not parse: {exc}") from None
    except StopIteration:
        raise ConfigError("cron", f"{_shown(cron)} has no slot in the next 50 years") from None
    return expression


def check_timezone(timezone: Any) -> str:
    """An IANA zone name. ZoneInfo opens the zone's file: a directory of the tz database
    (`Europe`) raises IsADirectoryError and an over-long name OSError, unknown zones both."""
    if not isinstance(timezone, str) or not timezone:
        raise ConfigError("timezone", f"must be an IANA time zone name, got {_shown(timezone)}")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(
            "timezone",
            f"unknown time zone {_shown(timezone)}; give an IANA name such as 'Europe/Paris'",
        ) from None
    return timezone


def check_every(every: Any) -> int:
    """`every` in whole seconds, from 1 to ten years (slots are keyed to the second)."""
    if isinstance(every, timedelta):
        number = every.total_seconds()
    elif isinstance(every, int | float) and not isinstance(every, bool):
        number = float(every)
    else:
        raise ConfigError("every", f"must be a number of seconds or a timedelta, got {every!r}")
    if not math.isfinite(number) or number <= 0:
        raise ConfigError("every", f"must be > 0 seconds, got {every!r}")
    if number != int(number):
        raise ConfigError("every", f"must be a whole number of seconds, got {every!r}")
    if number > MAX_EVERY:
        raise ConfigError("every", f"must be at most {MAX_EVERY} seconds (10 years), got {every!r}")
    return int(number)


def check_catch_up(catch_up: Any) -> CatchUp:
    if catch_up not in CATCH_UPS:
        raise ConfigError("catch_up", f"must be one of 'latest', 'all', 'none', got {catch_up!r}")
    value: CatchUp = catch_up
    return value


def _shown(value: Any, limit: int = 80) -> str:
    """`value` for a message: its repr, cut at `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_name(name: Any) -> str:
    return validate.name("name", name, MAX_NAME_LENGTH, error=ConfigError)
