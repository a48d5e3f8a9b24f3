"""Fan-out / fan-in: N children, then one job after all of them that reads their results."""

from typing import Any

import pgworker

registry = pgworker.Registry()


@registry.task("count-words")
async def count_words(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    return len(payload["text"].split())


@registry.task("sum-counts")
async def sum_counts(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    # ctx.parents: {parent_id: Job}, read once when this attempt started
    return sum(parent.result for parent in ctx.parents.values())


async def count_all(conn: Any, texts: list[str]) -> int:
    """Enqueue one child per text and the job that adds their counts up; its id."""
    async with conn.transaction():  # the children and their total, together or not at all
        children = await count_words.enqueue_many(conn, [{"text": t} for t in texts])
        total = await sum_counts.enqueue(conn, {}, after=[c.job.id for c in children])
    return total.job.id
