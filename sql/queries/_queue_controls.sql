-- A queue's controls, of the queues row `c`, as the queue statements return them.
c.name, c.paused_at, c.paused_by, c.pause_reason, c.max_running, c.rate_limit, c.rate_period
