-- Maintenance leadership as a lease row rather than a session advisory lock. A leader frozen
-- in the middle of a protocol exchange keeps its session (and any lock) forever: its backend
-- waits for the client, so no idle timeout fires. A lease expires on the clock: another worker
-- takes it, and the frozen one, once resumed, finds its renewal and its rescues fenced.
CREATE TABLE {schema}.leader (
    name       text PRIMARY KEY,
    worker_id  text        NOT NULL,
    elected_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
