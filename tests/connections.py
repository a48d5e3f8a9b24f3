"""Server connections per worker, sampled from pg_stat_activity: shared by
tests/test_connections.py and bench/connections.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

SAMPLE = """
SELECT application_name, xact_start IS NOT NULL AS in_transaction, count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'pgworker%'
GROUP BY 1, 2
"""


class Sample:
    """One look at pg_stat_activity: per worker id, its connections of the main pool and
    listener (`main`), and those of its steps' pool, in a transaction or not."""

    def __init__(self) -> None:
        self.main: Counter[str] = Counter()
        self.steps_in_transaction: Counter[str] = Counter()
        self.steps_idle: Counter[str] = Counter()

    def total(self, worker: str) -> int:
        return self.main[worker] + self.steps_in_transaction[worker] + self.steps_idle[worker]

    def workers(self) -> set[str]:
        return set(self.main) | set(self.steps_in_transaction) | set(self.steps_idle)


async def sample(conn: Any) -> Sample:
    s = Sample()
    for row in await conn.fetch(SAMPLE):
        name: str = row["application_name"]
        if name.startswith("pgworker-listen:"):
            s.main[name.removeprefix("pgworker-listen:")] += row["n"]
        elif name.endswith(":steps"):
            worker = name.removeprefix("pgworker:").removesuffix(":steps")
            counter = s.steps_in_transaction if row["in_transaction"] else s.steps_idle
            counter[worker] += row["n"]
        elif name.startswith("pgworker:"):
            s.main[name.removeprefix("pgworker:")] += row["n"]
    return s
