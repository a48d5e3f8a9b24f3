"""Pressure scenarios: one real worker at a fixed offered rate while the MVCC horizon is held.

    python -m bench.pressure [--short] [--rate 800|max] [--phases clean:60,idle_in_tx:180,...]
                             [--out bench/results/pressure.json]

A transaction held open elsewhere keeps every row version written since it began: pending jobs
claimed since stay in the claim's index, and each claim walks them. This harness measures what
that does to pickup latency, throughput and the tables, in the phases of the public job-queue
harness (hardbyte/postgresql-job-queue-benchmarking): `clean`, `idle_in_tx` (one transaction
holding an xid), `active_readers` (four REPEATABLE READ readers scanning pgworker's tables in
long transactions), `overload` (1.5 times the sustainable rate), `recovery`.

- `harness.py`: the options, the run (its database, its processes, the phases) and the samples;
- `enqueuer.py`: the producer process, open loop at the rate it is told;
- `report.py`: the tables printed per phase and the held phases beside the clean one;
- `bench/apps/pressure_app.py`: the worker's task, a handler of about a millisecond.

It needs only pgworker and asyncpg (this repository's .venv, not bench/.venv); see
bench/README.md, "Pressure: a held MVCC horizon"."""
