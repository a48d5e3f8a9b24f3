"""Retry policy: validated numbers and a pure delay computation."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff with jitter. The delay before retry n (from 1) is
    min(initial_delay * 2**(n-1), max_delay) * (1 ± jitter), in seconds."""

    max_retries: int = 3
    initial_delay: float = 1.0
    max_delay: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        mr = self.max_retries
        if isinstance(mr, bool) or not isinstance(mr, int) or mr < 0:
            raise ConfigError("max_retries", f"must be an int >= 0, got {mr!r}")
        for name in ("initial_delay", "max_delay", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(name, f"must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(name, f"must be finite, got {value!r}")
        if self.initial_delay <= 0:
            raise ConfigError("initial_delay", f"must be > 0 seconds, got {self.initial_delay!r}")
        if self.max_delay < self.initial_delay:
            raise ConfigError(
                "max_delay",
                f"must be >= initial_delay ({self.initial_delay}), got {self.max_delay}",
            )
        if not 0 <= self.jitter <= 1:
            raise ConfigError("jitter", f"must be between 0 and 1, got {self.jitter!r}")

    def delay(self, retry: int, rand: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (1 for the first retry)."""
        base = min(self.initial_delay * 2.0 ** min(max(retry - 1, 0), 64), self.max_delay)
        spread = (rand or random).uniform(-self.jitter, self.jitter)
        return base * (1.0 + spread)
