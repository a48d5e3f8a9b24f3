"""Retries: the policy a task declares, and the one rule that decides whether a failed attempt
is retried and when (the executor and the rescue of lost jobs both apply it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import _validate as validate
from .errors import ConfigError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff with jitter. The delay before retry n (from 1) is
    min(initial_delay * 2**(n-1), max_delay) * (1 ± jitter), in seconds. Delays are at most
    `validate.MAX_DELAY` (ten years), so that every computed time can be stored.

    `max_elapsed` (seconds, or a timedelta; None: no limit) caps retries in time as
    `max_retries` does in number: once that long has passed since the job's first attempt
    started (or its first attempt after a replay), a transient failure is final."""

    max_retries: int = 3
    initial_delay: float = 1.0
    max_delay: float = 300.0
    jitter: float = 0.1
    max_elapsed: float | None = None

    def __post_init__(self) -> None:
        validate.count("max_retries", self.max_retries, error=ConfigError)
        for name, zero in (("initial_delay", False), ("max_delay", True)):
            value = validate.seconds(name, getattr(self, name), zero=zero, error=ConfigError)
            object.__setattr__(self, name, value)  # a timedelta becomes seconds
        if self.max_delay < self.initial_delay:
            raise ConfigError(
                "max_delay",
                f"must be >= initial_delay ({self.initial_delay}), got {self.max_delay}",
            )
        jitter = self.jitter
        if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter <= 1:
            raise ConfigError("jitter", f"must be a number from 0 to 1, got {jitter!r}")
        if self.max_elapsed is not None:
            budget = validate.seconds("max_elapsed", self.max_elapsed, error=ConfigError)
            object.__setattr__(self, "max_elapsed", budget)

    def delay(self, retry: int, rand: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (1 for the first retry)."""
        base = min(self.initial_delay * 2.0 ** min(max(retry - 1, 0), 64), self.max_delay)
        spread = (rand or random).uniform(-self.jitter, self.jitter)
        return min(base * (1.0 + spread), validate.MAX_DELAY)


def next_retry(
    policy: RetryPolicy,
    retry_count: int,
    max_retries: int | None,
    after: float | None = None,
    elapsed: float | None = None,
) -> float | None:
    """Seconds until a job whose attempt failed (transiently) runs again, or None when that
    failure is final. `retry_count` is how many retries the job had; `max_retries` its own limit
    (None: the policy's); `after` a delay the handler asked for (`Retry(after=)`), else the
    policy's backoff for this retry; `elapsed` the seconds since the job's retry budget started
    (None: unknown, no budget applies). A retry due after the budget ends still runs: the
    budget decides at each failure, not in advance."""
    retries = policy.max_retries if max_retries is None else max_retries
    if retry_count >= retries or budget_spent(policy, elapsed):
        return None
    return validate.clamp_delay(policy.delay(retry_count + 1) if after is None else after)


def budget_spent(policy: RetryPolicy, elapsed: float | None) -> bool:
    """Whether the policy's retry budget in time (`max_elapsed`) is spent after `elapsed`
    seconds."""
    return policy.max_elapsed is not None and elapsed is not None and elapsed >= policy.max_elapsed


def why_final(policy: RetryPolicy, retry_count: int, max_retries: int | None) -> str:
    """What ended the retries of a job whose failure `next_retry` made final, as the end of its
    error: the count, else the time budget."""
    retries = policy.max_retries if max_retries is None else max_retries
    if retry_count >= retries:
        return f" (max_retries {retries} exhausted)"
    return f" (retry budget of {policy.max_elapsed:g}s spent)"
