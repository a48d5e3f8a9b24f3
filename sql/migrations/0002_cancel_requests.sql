-- Operator cancellation of running jobs: the request is stored so that a worker that missed the
-- notification still sees it on its next heartbeat, and so that the attempt's outcome can never
-- requeue a job whose cancellation was asked for.
ALTER TABLE {schema}.jobs ADD COLUMN cancel_requested_at timestamptz;
