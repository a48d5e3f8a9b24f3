-- The controls row of queue $1, when it has one, locked for the change.
current AS (
    SELECT {queue_controls}
    FROM {schema}.queues AS c
    WHERE c.name = $1
    FOR UPDATE
)
