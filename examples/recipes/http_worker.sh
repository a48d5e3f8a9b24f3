#!/usr/bin/env bash
# A worker in any language: enqueue, claim, heartbeat, complete, then read, over the HTTP API of
# `pgworker serve` (curl 7.82+ for --json, and jq). PGWORKER_URL: the server, PGWORKER_API_TOKEN.
set -euo pipefail
URL=${PGWORKER_URL:-http://127.0.0.1:8080}
AUTH="Authorization: Bearer ${PGWORKER_API_TOKEN:?set PGWORKER_API_TOKEN to a token of serve}"
api() { curl -sS --fail-with-body -H "$AUTH" "$@"; }

# 201 with the job; 200 with the same job when this key already holds it.
api --json '{"type": "send-invoice", "payload": {"invoice_id": 42},
             "idempotency_key": "invoice-42", "priority": "high"}' "$URL/jobs"

# 200 with a job and its attempt number, or 204 (empty) when nothing is due: then there is no
# job to work on (a long-running worker waits a few seconds and claims again).
job=$(api --json '{"worker_id": "billing-1", "types": ["send-invoice"], "lease": 60}' \
  "$URL/jobs/claim")
if [[ -z $job ]]; then
  echo "nothing to claim" >&2
  exit 0
fi
id=$(jq -r .id <<<"$job")
held="\"worker_id\": \"billing-1\", \"attempt\": $(jq -r .attempt <<<"$job")"

# While working: renew the lease. 409 means this attempt lost the job: drop its work.
api --json "{$held, \"lease\": 60}" "$URL/jobs/$id/heartbeat"

# Done: complete with a result (or POST .../fail with {"error": "...", "permanent": false}).
api --json "{$held, \"result\": {\"sent\": true}}" "$URL/jobs/$id/complete"

api "$URL/jobs/$id"                         # the job, its attempt_history, milestones, steps
api "$URL/jobs?status=failed&limit=20"      # newest first; next page: &before=<next_before>
api "$URL/queues"                           # counts by status, oldest pending age per queue
api "$URL/stats?window=hour&queue=mail"      # per minute: enqueued, completed, failed, p50/p95
