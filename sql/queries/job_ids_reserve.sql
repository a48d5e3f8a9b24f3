-- $1 new job ids, as text separated by commas, and the transaction's time, for a batch that COPY
-- writes (enqueue_many). Text, not bigint[]: asyncpg decodes an array only after looking its
-- type up, a catalog query of about 10 ms on each new connection. The sequence is looked up
-- once (an InitPlan, cast included), not once per id.
SELECT now() AS now,
       string_agg(nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id')::regclass))::text,
                  ',') AS ids
FROM generate_series(1, $1)
