"""What the pressure harness prints: a line per sample (a table per phase), each phase's
figures at its end, then every phase's last minute beside the clean phase's, with the ratios;
and the check the reduced form asserts (the clean phase kept up with the offered rate)."""

from __future__ import annotations

from typing import Any

CLAIM_INDEX = "jobs_claim_type_idx"
"""The index the plain claim reads its candidates along (sql/queries/_claim_due.sql)."""

HEADER = (
    f"{'t s':>7} {'offered':>8} {'sent/s':>7} {'done/s':>7} {'p50 ms':>7} {'p95 ms':>7} "
    f"{'p99 ms':>7} {'pending':>8} {'running':>7} {'dead jobs':>10} {'dead att.':>10} "
    f"{'jobs MB':>8} {'att. MB':>8} {'claim idx/scan':>14} {'held s':>7} {'xmin age':>9} "
    f"{'cores w/pg/oth':>15}"
)


def _f(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _mb(table: dict[str, Any] | None) -> float | None:
    if not table:
        return None
    return (table["heap_bytes"] + table["index_bytes"]) / 2**20


def sample_line(s: dict[str, Any], first: bool) -> None:
    if first:
        print(f"\n== {s['phase']} ==", flush=True)
        print(HEADER, flush=True)
    jobs, att = s["tables"].get("jobs"), s["tables"].get("job_attempts")
    idx = s["indexes"].get(CLAIM_INDEX, {})
    cpu = s["cpu_cores"]
    print(
        f"{s['phase_t']:>7.0f} {s['offered_rate']:>8.0f} {s['sent_rate']:>7.0f} "
        f"{s['completed_rate']:>7.0f} {_f(s['pickup_p50_ms']):>7} {_f(s['pickup_p95_ms']):>7} "
        f"{_f(s['pickup_p99_ms']):>7} {s['pending']:>8} {s['running']:>7} "
        f"{_f(jobs and jobs['dead'], 'd'):>10} {_f(att and att['dead'], 'd'):>10} "
        f"{_f(_mb(jobs)):>8} {_f(_mb(att)):>8} {_f(idx.get('entries_per_scan'), '.0f'):>14} "
        f"{_f(s['horizon_age_s'] and max(s['horizon_age_s'], 0), '.0f'):>7} "
        f"{_f(s['horizon_xids'], 'd'):>9} "
        f"{cpu['worker']:>5.2f}/{cpu['postgres']:.2f}/{cpu['others']:.2f}",
        flush=True,
    )
    slow = {k: a for k, a in s["statements"].items() if a["longest_s"] >= 1}
    for name, a in sorted(slow.items(), key=lambda kv: -kv[1]["longest_s"]):
        print(
            f"{'':>9}statement {name}: running {a['longest_s']:.1f} s "
            f"({a['active']} at once, {a['on_locks']} waiting on a lock)",
            flush=True,
        )
    for text, n in s["worker_log"].items():
        print(f"{'':>9}worker log: {text}" + (f" (x{n})" if n > 1 else ""), flush=True)


def claim_scan(explain: dict[str, Any] | None) -> dict[str, float] | None:
    """The median figures of the claim's scan of its candidates (CTE next)."""
    if not explain:
        return None
    for key, figures in explain["median"].get("scans", {}).items():
        if CLAIM_INDEX in key:
            return figures
    return None


def phase_end(p: dict[str, Any]) -> None:
    w, t = p["whole"], p["tail"]
    line = (
        f"{p['label']}: whole phase: done {w['completed_rate']:,.0f}/s, pickup p50/p95/p99 "
        f"{_f(w['pickup_p50_ms'])}/{_f(w['pickup_p95_ms'])}/{_f(w['pickup_p99_ms'])} ms; "
        f"last {t['seconds']:.0f} s: done {t['completed_rate']:,.0f}/s, pickup "
        f"{_f(t['pickup_p50_ms'])}/{_f(t['pickup_p95_ms'])}/{_f(t['pickup_p99_ms'])} ms"
    )
    if p["explain"]:
        m = p["explain"]["median"]
        scan = claim_scan(p["explain"]) or {}
        line += (
            f"; claim EXPLAIN: {m['buffers']:.0f} buffers, {m['execution_ms']:.2f} ms, "
            f"{scan.get('buffers', 0):.0f} buffers in {CLAIM_INDEX}"
        )
    print(line, flush=True)


def tail_entries_per_scan(p: dict[str, Any], tail_s: float) -> float | None:
    """Index entries the claim's index returned per scan over the phase's last `tail_s`."""
    scans = read = 0
    for s in p["samples"]:
        if s["phase_t"] > p["seconds"] - tail_s:
            idx = s["indexes"].get(CLAIM_INDEX, {})
            scans += idx.get("scans", 0)
            read += idx.get("entries_read", 0)
    return read / scans if scans else None


def figures(p: dict[str, Any], tail_s: float) -> dict[str, Any]:
    """A phase's figures as compared: the clean phase over its whole length, the others over
    their last `tail_s` seconds; tables as the phase ended; the claim's EXPLAIN at its end."""
    span = p["whole"] if p["kind"] == "clean" else p["tail"]
    end = p["end"] or {"tables": {}, "pending": None}
    jobs, att = end["tables"].get("jobs"), end["tables"].get("job_attempts")
    scan = claim_scan(p["explain"]) or {}
    return {
        "span_s": span["seconds"],
        "completed_rate": span["completed_rate"],
        "pickup_p50_ms": span["pickup_p50_ms"],
        "pickup_p95_ms": span["pickup_p95_ms"],
        "pickup_p99_ms": span["pickup_p99_ms"],
        "pending_at_end": end["pending"],
        "dead_jobs": jobs and jobs["dead"],
        "dead_attempts": att and att["dead"],
        "jobs_mb": _mb(jobs),
        "attempts_mb": _mb(att),
        "claim_index_entries_per_scan": tail_entries_per_scan(
            p, p["seconds"] if p["kind"] == "clean" else tail_s
        ),
        "claim_buffers": p["explain"]["median"]["buffers"] if p["explain"] else None,
        "claim_index_buffers": scan.get("buffers"),
        "claim_ms": p["explain"]["median"]["execution_ms"] if p["explain"] else None,
    }


ROWS = (
    ("pickup p50 ms", "pickup_p50_ms", ".1f", True),
    ("pickup p95 ms", "pickup_p95_ms", ".1f", True),
    ("pickup p99 ms", "pickup_p99_ms", ".1f", True),
    ("completed jobs/s", "completed_rate", ",.0f", True),
    ("span (s)", "span_s", ".0f", False),
    ("pending at end", "pending_at_end", ",d", False),
    ("dead tuples jobs", "dead_jobs", ",d", False),
    ("dead tuples job_attempts", "dead_attempts", ",d", False),
    ("jobs MB (heap+indexes)", "jobs_mb", ".1f", True),
    ("job_attempts MB", "attempts_mb", ".1f", True),
    (f"{CLAIM_INDEX} entries read/scan", "claim_index_entries_per_scan", ",.0f", True),
    ("claim buffers (EXPLAIN)", "claim_buffers", ",.0f", True),
    (f"  of which {CLAIM_INDEX}", "claim_index_buffers", ",.0f", True),
    ("claim execution ms (EXPLAIN)", "claim_ms", ".2f", True),
)


def summary(doc: dict[str, Any]) -> None:
    tail_s = doc["config"]["tail_s"]
    phases = [p for p in doc["phases"] if p["kind"] != "warmup"]
    clean = next(p for p in phases if p["kind"] == "clean")
    base = figures(clean, tail_s)
    others = [p for p in phases if p is not clean]
    cols = [("clean", base)] + [(p["label"], figures(p, tail_s)) for p in others]
    print(
        "\n== each phase beside the clean one (clean: its whole length; the others: their "
        f"last {tail_s:.0f} s or less; x clean) ==",
        flush=True,
    )
    width = 34
    print(f"{'':<{width}}" + "".join(f"{label:>22}" for label, _ in cols))
    for title, key, spec, ratio in ROWS:
        line = f"{title:<{width}}"
        for label, f in cols:
            v = f[key]
            cell = _f(v, spec)
            b = base[key]
            if label != "clean" and ratio and v is not None and b:
                cell += f" (x{v / b:.1f})"
            line += f"{cell:>22}"
        print(line)
    c = doc["checks"]
    print(f"\ncheck: {c['message']}", flush=True)
    if c.get("clean_held_s"):
        print(
            f"warning: the clean phase was not clean: a transaction held the horizon for up to "
            f"{c['clean_held_s']:.0f} s (another database's transaction that holds an xid "
            "counts: it is in every snapshot taken while it runs)",
            flush=True,
        )
    for p in phases:
        if p["explain"] and p["kind"] in ("clean", "idle_in_tx", "active_readers"):
            print(
                f"\nclaim plan at the end of {p['label']} (EXPLAIN (ANALYZE, BUFFERS), "
                "rolled back):"
            )
            print("\n".join(p["explain"]["plan"]))


def checks(phases: list[dict[str, Any]], least: float) -> dict[str, Any]:
    """The reduced form's assertion: every phase ran and sampled, and the clean phase completed
    at least `least` of its offered rate. No latency is asserted."""
    clean = next(p for p in phases if p["kind"] == "clean")
    done, offered = clean["whole"]["completed_rate"], clean["rate"]
    empty = [p["label"] for p in phases if not p["samples"]]
    ok = done >= least * offered and not empty
    held = max((s["horizon_age_s"] or 0 for s in clean["samples"]), default=0)
    message = (
        f"clean phase completed {done:,.0f} jobs/s of {offered:,.0f} offered "
        f"({done / offered:.0%}; at least {least:.0%} needed)"
        + (f"; phases without samples: {', '.join(empty)}" if empty else "")
        + (": ok" if ok else ": FAILED")
    )
    return {
        "ok": ok,
        "clean_completed_rate": done,
        "offered_rate": offered,
        "message": message,
        # A transaction older than a few seconds held the horizon during the clean phase.
        "clean_held_s": held if held > 5 else None,
    }
