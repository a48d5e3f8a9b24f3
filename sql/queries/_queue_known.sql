-- Whether queue $1 is known: before the statement, a controls row (CTE `current`), a pending
-- job or a registered worker named it.
EXISTS (SELECT FROM current)
OR EXISTS (SELECT FROM {schema}.jobs AS j WHERE j.status = 'pending' AND j.queue = $1)
OR EXISTS (SELECT FROM {schema}.workers AS w WHERE $1 = ANY (w.queues))
