-- $1 new job ids, and the transaction's time, for a batch that COPY writes (enqueue_many).
SELECT now() AS now, array_agg(nextval(pg_get_serial_sequence('{schema}.jobs', 'id'))) AS ids
FROM generate_series(1, $1)
