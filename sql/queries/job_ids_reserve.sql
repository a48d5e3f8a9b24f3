-- $1 new job ids, and the transaction's time, for a batch that COPY writes (enqueue_many). The
-- sequence is looked up once (an InitPlan, cast included), not once per id.
SELECT now() AS now,
       array_agg(nextval((SELECT pg_get_serial_sequence('{schema}.jobs', 'id')::regclass))) AS ids
FROM generate_series(1, $1)
