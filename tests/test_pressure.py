"""The pressure harness's pure parts (bench/pressure/): the phases it accepts, the reduced form's
length, the claim's figures read from EXPLAIN (FORMAT JSON), and the one check it asserts. The
harness itself runs as `make pressure-short` (CI), not here: it takes minutes."""

from __future__ import annotations

from typing import Any

import pytest

from bench.pressure import harness, report


def test_the_reduced_form_fits_in_three_minutes_with_every_phase():
    phases = harness.parse_phases(harness.SHORT)
    assert {p.kind for p in phases} == set(harness.KINDS)
    # Start-up (database, migration, worker) and the end take about 15 s.
    assert sum(p.seconds for p in phases) <= 150


def test_the_full_form_holds_the_horizon_fifteen_minutes_each_way():
    phases = {p.label: p for p in harness.parse_phases(harness.FULL)}
    assert phases["idle_in_tx"].seconds == phases["active_readers"].seconds == 900
    assert [p.label for p in harness.parse_phases(harness.FULL)].count("recovery") == 1
    assert "recovery_3" in phases


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("clean:60,nap:10", "unknown phase 'nap'"),
        ("clean", "needs seconds"),
        ("clean:0", "seconds must be > 0"),
        ("idle_in_tx:60", "a `clean` phase is needed"),
    ],
)
def test_bad_phases_are_refused_by_name(text, says):
    with pytest.raises(ValueError, match="--phases") as caught:
        harness.parse_phases(text)
    assert says in str(caught.value)


def node(kind: str, hit: int, **extra: Any) -> dict[str, Any]:
    return {"Node Type": kind, "Shared Hit Blocks": hit, **extra}


def test_the_claims_buffers_count_each_cte_once():
    """The top node counts the CTEs it reads (`claimed`, and `next` through it); the INSERT of
    the attempt rows, which nothing reads, runs apart and is added."""
    index_scan = node(
        "Index Scan",
        90,
        **{"Index Name": "jobs_claim_type_idx", "Relation Name": "jobs", "Actual Rows": 3},
    )
    plan = node(
        "Sort",
        120,
        Plans=[
            node("Limit", 90, **{"Subplan Name": "CTE next", "Plans": [index_scan]}),
            node(
                "ModifyTable",
                120,
                **{
                    "Subplan Name": "CTE claimed",
                    "Plans": [node("CTE Scan", 90, **{"CTE Name": "next"})],
                },
            ),
            node(
                "ModifyTable",
                7,
                **{
                    "Subplan Name": "CTE opened",
                    "Plans": [node("CTE Scan", 0, **{"CTE Name": "claimed"})],
                },
            ),
            node("CTE Scan", 120, **{"CTE Name": "claimed"}),
        ],
    )
    figures = harness.plan_figures({"Plan": plan, "Execution Time": 1.5})
    assert figures["buffers"] == 127
    assert figures["scans"] == {
        "Index Scan using jobs_claim_type_idx (CTE next)": {"buffers": 90, "rows": 3, "loops": 1}
    }
    assert (
        report.claim_scan({"median": figures})
        == figures["scans"]["Index Scan using jobs_claim_type_idx (CTE next)"]
    )


def phase(done: float, samples: int = 1) -> dict[str, Any]:
    return {
        "label": "clean",
        "kind": "clean",
        "rate": 800.0,
        "whole": {"completed_rate": done},
        "samples": [{"horizon_age_s": 0.0}] * samples,
    }


def test_the_check_is_that_the_clean_phase_kept_up():
    assert report.checks([phase(790.0)], 0.95)["ok"]
    failed = report.checks([phase(700.0)], 0.95)
    assert not failed["ok"]
    assert "FAILED" in failed["message"]
    assert not report.checks([phase(800.0, samples=0)], 0.95)["ok"]
