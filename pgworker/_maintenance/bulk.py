"""Bulk actions with nobody to run them: the leader adopts every running action whose runner's
lease lapsed (a console or `pgworker serve` killed midway, a `replay --filter` interrupted) or
that no runner ever took, and runs it, a batch of each per round, under the worker's id (kind
`worker`). So an action created by a console that went away is finished even where no other
console runs; a console that is still there renews its lease with every batch and keeps its
actions (pgworker/_bulk.py)."""

from __future__ import annotations

from typing import Any

from .. import _bulk as bulk
from ..settings import Settings
from .leader import interval

BUSY = 0.0
"""Seconds between two rounds while an action is left to run: none (each round is one batch of
each action, on the shared connection other services take turns on)."""


class BulkActions:
    name = "bulk"

    def __init__(self, pool: Any, settings: Settings) -> None:
        self._pool = pool
        self._schema = settings.schema
        self.every = interval(settings.lease)
        self.holder = bulk.Holder(settings.worker_id, "worker", bulk.lease())

    async def step(self) -> float:
        held = await bulk.claim(self._pool, self.holder, schema=self._schema)
        for action_id in held:
            await bulk.step(self._pool, action_id, holder=self.holder, schema=self._schema)
        return BUSY if held else self.every
