"""The report: the medians of the runs, the table and the ratios under it, in Markdown. It reads
only the report's dict (what latest.json holds), so a saved run can be rendered again."""

from __future__ import annotations

import statistics
from typing import Any

from bench.systems import BASE, GROWTH, LIB_SYSTEMS, OPTIONAL, PEERS, SYSTEMS

FLEET = ("pgworker", "pgworker-pooler")  # the systems W5 measures
W5_TARGET = 0.9  # target: W5 within 10% of W1
POOLER_TARGET = 0.8  # target: pooler mode within 20% of direct
PROCESSING_TARGET = 0.6  # target: processing at concurrency 10, against the floor
PROCESSING_TARGET_C100 = 0.7  # the same at concurrency 100
PG_CPU_TARGET = 1.15  # target: PostgreSQL CPU per job, against the floor's
WORKER_CPU_TARGET = 3.0  # target: worker CPU per job, against the floor's client
ENQUEUE_TARGET = 0.5  # target: bulk enqueue, against the floor's COPY
WAKE_UP_TARGET_MS = 0.5  # target: the wake-up's p50, beyond the floor's

FIGURES = (
    "enqueue_jps",
    "processing_jps",
    "worker_cpu_ms_per_1k",
    "pg_cpu_ms_per_1k",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "server_connections_max",
    "pooler_cpu_ms_per_1k",
)


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    rows: dict[str, dict[str, float | None]] = {}
    names: list[str] = []
    for r in runs:
        for name in r["systems"]:
            if name not in names:
                names.append(name)
    for name in names:
        per = [r["systems"][name] for r in runs if name in r["systems"]]
        rows[name] = {f: median([p.get(f) for p in per]) for f in FIGURES}
        checks = [p["check"] for p in per if "check" in p]
        if checks:
            bad = [c for c in checks if not c.startswith("ok")]
            rows[name]["check"] = bad[0] if bad else checks[0]  # type: ignore[assignment]
    return rows


def render(report: dict[str, Any]) -> str:
    cfg, med = report["config"], report["medians"]
    labels = {name: system.label(cfg) for name, system in SYSTEMS.items()}
    labels["pgworker@growth"] = f"pgworker on {cfg['growth_rows']:,} finished jobs (W4)"
    for name in FLEET:
        labels[f"{name}@fleet"] = f"{labels[name]}, fleet features in the table (W5)"
    head = (
        "| system | bulk enqueue jobs/s | processing jobs/s | worker CPU ms/1k | "
        "PostgreSQL CPU ms/1k | server connections | wake-up p50 / p95 / p99 ms | check |"
    )
    lines = [
        f"# pgworker benchmark — {report['finished_at']}",
        "",
        f"N = {cfg['n']:,} no-op jobs per drain, {cfg['runs']} run(s), medians shown; "
        f"one worker process at concurrency {cfg['concurrency']}; wake-up: "
        f"{cfg['latency_count']} jobs at {cfg['rate']:g}/s. Machine: {report['machine']}.",
        "",
        head,
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = [
        s
        for s in (
            "pgworker",
            BASE,
            *OPTIONAL,
            *LIB_SYSTEMS[1:],
            "floor",
            "pgworker@growth",
            *(f"{f}@fleet" for f in FLEET),
        )
        if s in med
    ]
    for name in order:
        m = med[name]
        lat = (
            "–"
            if m.get("latency_p50_ms") is None
            else f"{fmt(m['latency_p50_ms'], 1)} / {fmt(m['latency_p95_ms'], 1)} / "
            f"{fmt(m['latency_p99_ms'], 1)}"
        )
        proc = fmt(m["processing_jps"])
        w1 = med.get("pgworker", {}).get("processing_jps")
        if name == "pgworker@growth" and w1 and m.get("processing_jps"):
            proc += f" ({m['processing_jps'] / w1:.2f}× W1)"
        if name.endswith("@fleet") and m.get("processing_jps"):
            own_w1 = med.get(name.removesuffix("@fleet"), {}).get("processing_jps")
            if own_w1:
                proc += f" ({m['processing_jps'] / own_w1:.2f}× its W1)"
        lines.append(
            f"| {labels.get(name, name)} | {fmt(m['enqueue_jps'])} | {proc} | "
            f"{fmt(m['worker_cpu_ms_per_1k'])} | {fmt(m['pg_cpu_ms_per_1k'])} | "
            f"{fmt(m.get('server_connections_max'))} | {lat} | "
            f"{m.get('check', '')} |"
        )
    lines.append("")
    lines += ratio_lines(med)
    lines += floor_lines(report["runs"], cfg["concurrency"])
    lines += fleet_lines(report["runs"])
    lines += base_lines(report["runs"])
    lines += metrics_lines(report["runs"])
    lines.append("")
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    if cfg.get("pgqueuer_note"):
        lines.append("")
        lines.append(cfg["pgqueuer_note"])
    lines += SYSTEMS[GROWTH].extra_report(report)
    prof = report.get("profile")
    if prof:
        lines += [
            "",
            f"## py-spy on the pgworker worker ({prof['samples']} samples while draining at "
            f"{prof['processing_jps_while_sampled']:,.0f} jobs/s; idle excluded)",
            "",
            "| own % | function | | cumulative % | function |",
            "|---:|---|---|---:|---|",
        ]
        for (f1, p1), (f2, p2) in zip(prof["own"], prof["cumulative"], strict=False):
            lines.append(f"| {p1:.1f} | `{f1}` | | {p2:.1f} | `{f2}` |")
        lines += ["", "Own time by package (the leaf frame's):", ""]
        lines += [f"- {pkg}: {p:.1f}%" for pkg, p in prof["own_by_package"]]
        lines += ["", "pgworker's own frames, cumulative:", ""]
        lines += [f"- {p:.1f}% `{f}`" for f, p in prof["pgworker_cumulative"]]
    return "\n".join(lines) + "\n"


def ratio_lines(med: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    pgw = med.get("pgworker") or {}
    peers = {p: med[p] for p in PEERS if p in med}
    if pgw and peers:

        def best(key: str, low: bool = False) -> tuple[str, float] | None:
            vals = [(p, m[key]) for p, m in peers.items() if m.get(key) is not None]
            if not vals:
                return None
            return (min if low else max)(vals, key=lambda x: x[1])

        for key, label in (("processing_jps", "processing"), ("enqueue_jps", "bulk enqueue")):
            b = best(key)
            if b and pgw.get(key):
                out.append(
                    f"- pgworker / best peer, {label}: {pgw[key] / b[1]:.2f}× "
                    f"({fmt(pgw[key])} vs {b[0]} {fmt(b[1])} jobs/s; higher is better)"
                )
        for key, label in (
            ("worker_cpu_ms_per_1k", "worker CPU"),
            ("pg_cpu_ms_per_1k", "PostgreSQL CPU"),
        ):
            b = best(key, low=True)
            if b and pgw.get(key) is not None and b[1]:
                out.append(
                    f"- pgworker / best peer, {label}: {pgw[key] / b[1]:.2f}× "
                    f"({fmt(pgw[key])} vs {b[0]} {fmt(b[1])} ms/1k jobs; lower is better)"
                )
        totals = {
            p: m["worker_cpu_ms_per_1k"] + m["pg_cpu_ms_per_1k"]
            for p, m in peers.items()
            if m.get("worker_cpu_ms_per_1k") is not None and m.get("pg_cpu_ms_per_1k") is not None
        }
        if totals and pgw.get("worker_cpu_ms_per_1k") is not None:
            p, v = min(totals.items(), key=lambda x: x[1])
            mine = pgw["worker_cpu_ms_per_1k"] + pgw["pg_cpu_ms_per_1k"]
            out.append(
                f"- pgworker / best peer, total CPU (worker + PostgreSQL): {mine / v:.2f}× "
                f"({fmt(mine)} vs {p} {fmt(v)} ms/1k jobs; lower is better)"
            )
        durable = med.get("pgworker-durable", {}).get("processing_jps")
        b = best("processing_jps")
        if durable and b:
            out.append(
                f"- pgworker --durable-claims / best peer, processing: {durable / b[1]:.2f}× "
                f"({fmt(durable)} vs {b[0]} {fmt(b[1])} jobs/s)"
            )
        uncapped = med.get("pgqueuer-defaults", {}).get("processing_jps")
        if uncapped and pgw.get("processing_jps"):
            out.append(
                f"- pgworker / pgqueuer with its own defaults (not at concurrency 10), "
                f"processing: {pgw['processing_jps'] / uncapped:.2f}× "
                f"({fmt(pgw['processing_jps'])} vs {fmt(uncapped)} jobs/s)"
            )
    f = med.get("floor", {})
    if pgw.get("processing_jps") and f.get("processing_jps"):
        out.append(
            f"- pgworker / floor, processing: {pgw['processing_jps'] / f['processing_jps']:.2f}× "
            f"({fmt(pgw['processing_jps'])} vs {fmt(f['processing_jps'])} jobs/s)"
        )
    if pgw and pgw.get("latency_p50_ms") and f.get("latency_p50_ms"):
        out.append(
            f"- wake-up p50 / p99, pgworker − floor: "
            f"{pgw['latency_p50_ms'] - f['latency_p50_ms']:+.1f} / "
            f"{pgw['latency_p99_ms'] - f['latency_p99_ms']:+.1f} ms "
            f"(the floor's {fmt(f['latency_p50_ms'], 1)} / {fmt(f['latency_p99_ms'], 1)} ms: a "
            f"durable insert and its NOTIFY, then one claim)"
        )
    out += pooler_lines(pgw, med.get("pgworker-pooler") or {})
    g = med.get("pgworker@growth")
    if pgw.get("processing_jps") and g and g.get("processing_jps"):
        out.append(
            f"- pgworker on a grown table / fresh table, processing: "
            f"{g['processing_jps'] / pgw['processing_jps']:.2f}×"
        )
    return out


def paired(runs: list[dict[str, Any]], num: str, den: str, key: str) -> list[float]:
    """The ratio num / den of `key` within each run that measured both."""
    out = []
    for r in runs:
        a, b = r["systems"].get(num, {}), r["systems"].get(den, {})
        if a.get(key) and b.get(key):
            out.append(a[key] / b[key])
    return out


def differences(runs: list[dict[str, Any]], num: str, den: str, key: str) -> list[float]:
    """The difference num - den of `key` within each run that measured both."""
    out = []
    for r in runs:
        a, b = r["systems"].get(num, {}), r["systems"].get(den, {})
        if a.get(key) is not None and b.get(key) is not None:
            out.append(a[key] - b[key])
    return out


def target_line(
    label: str, values: list[float], target: float, at_most: bool = False, unit: str = "×"
) -> list[str]:
    """One target's line: each run's figure, their median, and whether the median meets it."""
    if not values:
        return []
    mid = median(values)
    assert mid is not None
    met = mid <= target if at_most else mid >= target
    sign = "+" if unit == " ms" else ""
    shown = ", ".join(f"{x:{sign}.2f}{unit}" for x in values)
    return [
        f"- {label}: {shown} per run, median {mid:{sign}.2f}{unit} "
        f"(target {'≤' if at_most else '≥'} {target:{sign}.2f}{unit}{'' if met else '; MISSED'})"
    ]


def floor_lines(runs: list[dict[str, Any]], concurrency: int) -> list[str]:
    """The floor targets, per run and as the median of the runs' figures:
    processing, CPU per job (PostgreSQL's, and the worker's against the floor's client), bulk
    enqueue and the wake-up's p50."""
    rate = PROCESSING_TARGET_C100 if concurrency >= 100 else PROCESSING_TARGET
    ratios = (
        ("processing", "processing_jps", rate, False),
        ("PostgreSQL CPU per job", "pg_cpu_ms_per_1k", PG_CPU_TARGET, True),
        (
            "worker CPU per job (the floor's client)",
            "worker_cpu_ms_per_1k",
            WORKER_CPU_TARGET,
            True,
        ),
        ("bulk enqueue", "enqueue_jps", ENQUEUE_TARGET, False),
    )
    out = []
    for label, key, target, at_most in ratios:
        out += target_line(
            f"pgworker / floor, {label}", paired(runs, "pgworker", "floor", key), target, at_most
        )
    out += target_line(
        "pgworker − floor, wake-up p50",
        differences(runs, "pgworker", "floor", "latency_p50_ms"),
        WAKE_UP_TARGET_MS,
        at_most=True,
        unit=" ms",
    )
    return ["", "## Against the floor, each run", "", *out] if out else []


def fleet_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The fleet targets, per run and as the median of the runs' ratios: W5 (the fleet's
    features in the table) / W1 (an empty table), and pooler mode / direct, processing."""
    out = []
    key = "processing_jps"
    for system in FLEET:
        out += target_line(
            f"W5 (fleet features in the table) / W1 (empty table), processing, {system}",
            paired(runs, f"{system}@fleet", system, key),
            W5_TARGET,
        )
    for label, suffix in (("W1", ""), ("W5", "@fleet")):
        out += target_line(
            f"pooler / direct, processing, {label}",
            paired(runs, f"pgworker-pooler{suffix}", f"pgworker{suffix}", key),
            POOLER_TARGET,
        )
    return ["", "## The fleet's features in the table, and pooler mode", "", *out] if out else []


def pooler_lines(direct: dict[str, Any], pooled: dict[str, Any]) -> list[str]:
    """What pooler mode costs: pgworker --pooler through PgBouncer against pgworker direct."""
    if not (direct.get("processing_jps") and pooled.get("processing_jps")):
        return []
    out = [
        f"- pgworker --pooler / direct, processing: "
        f"{pooled['processing_jps'] / direct['processing_jps']:.2f}× "
        f"({fmt(pooled['processing_jps'])} vs {fmt(direct['processing_jps'])} jobs/s)"
    ]
    for key, label in (
        ("worker_cpu_ms_per_1k", "worker CPU"),
        ("pg_cpu_ms_per_1k", "PostgreSQL CPU"),
    ):
        if pooled.get(key) is not None and direct.get(key):
            out.append(
                f"- pgworker --pooler / direct, {label}: {pooled[key] / direct[key]:.2f}× "
                f"({fmt(pooled[key])} vs {fmt(direct[key])} ms/1k jobs)"
            )
    if pooled.get("pooler_cpu_ms_per_1k") is not None:
        out.append(f"- PgBouncer's own CPU: {fmt(pooled['pooler_cpu_ms_per_1k'])} ms/1k jobs")
    return out


def base_lines(runs: list[dict[str, Any]]) -> list[str]:
    """pgworker against pgworker-base, each figure of each run as a ratio to that run's floor
    (W3), then the medians of those ratios and new / old."""
    figures = (
        ("processing_jps", "processing"),
        ("worker_cpu_ms_per_1k", "worker CPU/job"),
        ("pg_cpu_ms_per_1k", "PostgreSQL CPU/job"),
    )
    per: dict[str, dict[str, list[float]]] = {"pgworker": {}, BASE: {}}
    out = [
        "",
        "## pgworker (new) against pgworker-base (old), as ratios to each run's floor",
        "",
        "| run | system | processing jobs/s | worker CPU ms/1k | PostgreSQL CPU ms/1k |",
        "|---|---|---:|---:|---:|",
    ]
    for r in runs:
        floor = r["systems"].get("floor", {})
        for name in per:
            m = r["systems"].get(name, {})
            if not all(m.get(k) and floor.get(k) for k, _ in figures):
                continue
            cells = []
            for k, _ in figures:
                ratio = m[k] / floor[k]
                per[name].setdefault(k, []).append(ratio)
                cells.append(f"{fmt(m[k])} ({ratio:.3f}× floor {fmt(floor[k])})")
            out.append(f"| {r['run']} | {name} | " + " | ".join(cells) + " |")
    if not per[BASE] or not per["pgworker"]:
        return []
    for k, label in figures:
        new, old = median(per["pgworker"].get(k, [])), median(per[BASE].get(k, []))
        if new and old:
            out.append(
                f"- {label}, median ratio to the floor: new {new:.3f}×, old {old:.3f}×; "
                f"new / old {new / old:.3f}"
            )
    paired = []
    for k, label in figures:
        pairs = [
            m["pgworker"][k] / m[BASE][k]
            for m in (r["systems"] for r in runs)
            if m.get("pgworker", {}).get(k) and m.get(BASE, {}).get(k)
        ]
        if pairs:
            each = ", ".join(f"{x:.3f}" for x in pairs)
            paired.append(f"{label} {median(pairs):.3f} ({each})")
    out.append("- new / old within each run, median (per run): " + "; ".join(paired))
    return out


def metrics_lines(runs: list[dict[str, Any]]) -> list[str]:
    """What metrics cost: pgworker-metrics against pgworker within each run (measured one after
    the other), and each against that run's floor when W3 ran."""
    name = "pgworker-metrics"
    figures = (
        ("processing_jps", "processing", "higher is better"),
        ("worker_cpu_ms_per_1k", "worker CPU/job", "lower is better"),
    )
    out = []
    for k, label, better in figures:
        pairs = [
            m[name][k] / m["pgworker"][k]
            for m in (r["systems"] for r in runs)
            if m.get(name, {}).get(k) and m.get("pgworker", {}).get(k)
        ]
        if pairs:
            each = ", ".join(f"{x:.3f}" for x in pairs)
            out.append(
                f"- pgworker --metrics-port / pgworker, {label}, median of the runs' ratios: "
                f"{median(pairs):.3f}× ({each}; {better})"
            )
        for system in ("pgworker", name):
            floors = [
                m[system][k] / m["floor"][k]
                for m in (r["systems"] for r in runs)
                if m.get(system, {}).get(k) and m.get("floor", {}).get(k)
            ]
            if floors and k == "processing_jps":
                out.append(
                    f"- {system} / floor, processing, median of the runs' ratios: "
                    f"{median(floors):.3f}×"
                )
    return ["", "## What metrics cost", "", *out] if out else []


def footnotes(runs: list[dict[str, Any]]) -> str:
    """What may have disturbed the measurements: other programs' CPU, other databases' queries."""
    text = ""
    busy = [
        f"run {r['run']} {name}: {out['other_active_backends_max']}"
        for r in runs
        for name, out in r["systems"].items()
        if out.get("other_active_backends_max")
    ]
    noisy = [
        f"run {r['run']} {name}: {out['other_cpu_cores']:.2f}"
        for r in runs
        for name, out in r["systems"].items()
        if out.get("other_cpu_cores", 0) > 0.1
    ]
    if noisy:
        text += (
            "\nNote: other programs kept the machine busy during some drains (cores used on "
            "average, outside the worker, its PostgreSQL server and the benchmark): "
            + "; ".join(noisy)
            + "\n"
        )
    if busy:
        text += (
            "\nNote: other databases on this server had active queries during some drains "
            "(their PostgreSQL CPU is counted too): " + "; ".join(busy) + "\n"
        )
    return text
