"""docs/grafana-dashboard.json: every panel's SQL runs on a migrated database holding jobs of every
kind, and every metric its PromQL names is in a real scrape of a worker."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import pgworker

from .apps.metrics import registry
from .docs import page, section
from .helpers import ROOT, fake_claim, wait_for
from .test_metrics import free_port, scrape

pytestmark = pytest.mark.asyncio(loop_scope="session")

DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\bpgworker_[a-z_]+\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def panels() -> list[dict[str, Any]]:
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found += [panel, *panel.get("panels", [])]
    return found


def targets(key: str) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in panels() for t in p.get("targets", []) if key in t]


async def test_the_dashboard_is_grafana_json_with_both_kinds_of_panel():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["panels"]
    sources = {v["name"]: v["query"] for v in dashboard["templating"]["list"]}
    assert sources == {"prometheus": "prometheus", "postgres": "grafana-postgresql-datasource"}
    sql, promql = targets("rawSql"), targets("expr")
    assert len(sql) >= 5 and len(promql) >= 10
    for _, target in sql:
        assert target["datasource"]["type"] == "grafana-postgresql-datasource"
    for _, target in promql:
        assert target["datasource"]["type"] == "prometheus"
    views = {"type_stats", "recent_failures", "overdue_jobs", "queue_backlog", "worker_activity"}
    assert views <= {m for _, t in sql for m in re.findall(r"pgworker\.(\w+)", t["rawSql"])}
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))


async def test_each_panels_sql_runs_on_a_migrated_database(dsn, conn):
    # Something in every view: a finished, a failed, a due pending and an overdue job, a worker.
    for type_ in ("ok", "doomed", "flaky"):
        await pgworker.enqueue(conn, type_, {})
    async with pgworker.Worker(registry, dsn, concurrency=2):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 3 FROM pgworker.jobs WHERE status IN ('completed', 'failed')"
            )
        )
    overdue = await pgworker.enqueue(conn, "ok", {})
    await fake_claim(conn, overdue.job.id)
    await pgworker.enqueue(conn, "ok", {}, queue="elsewhere")
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency) "
        "VALUES ('ghost', 'h', 1, '{default}', '{ok}', 1)"
    )
    for title, target in targets("rawSql"):
        rows = await conn.fetch(target["rawSql"])
        assert rows, (title, "returned no row")


async def test_each_metric_the_promql_names_is_in_a_real_scrape(dsn, conn):
    port = free_port()
    for type_ in ("ok", "doomed"):
        await pgworker.enqueue(conn, type_, {})
    await pgworker.enqueue(conn, "ok", {}, delay=3600)
    async with pgworker.Worker(registry, dsn, metrics_port=port, lease=1):
        # The leader's queue gauges, and the series of the jobs once they ended.
        wanted = {
            "pgworker_queue_oldest_pending_seconds",
            "pgworker_jobs_total",
            "pgworker_job_run_seconds_bucket",
        }
        samples = await wait_for(
            lambda: (s := scrape(port)) and wanted <= {name for name, _ in s} and s
        )
    scraped = {name for name, _ in samples}
    named = {m for _, t in targets("expr") for m in METRIC.findall(t["expr"])}
    assert named, "no metric named"
    # The alerts of docs/operations/monitoring.md too.
    alerts = section(page("operations/monitoring.md"), "## What to alert on")
    named |= set(METRIC.findall(alerts))
    missing = sorted(named - scraped)
    assert not missing, missing
    families = {n.removesuffix(s) for n in scraped for s in SUFFIXES if n.endswith(s)} | scraped
    assert {
        "pgworker_jobs",
        "pgworker_job_run_seconds",
        "pgworker_job_wait_seconds",
        "pgworker_slots",
        "pgworker_slots_busy",
        "pgworker_claims",
        "pgworker_db_reconnects",
        "pgworker_queue_jobs",
        "pgworker_queue_oldest_pending_seconds",
    } <= families
