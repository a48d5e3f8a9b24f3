-- Pending (queue, type, version) triples that no worker seen in the last $1 seconds serves. A
-- worker's `types` lists the (type, version) pairs it serves as registry.served_key writes them:
-- the bare type for version 1 (as every worker did before versions existed), `type@version`
-- otherwise, and always `type@version` for a type whose name holds an `@`.
SELECT DISTINCT j.queue, j.type, j.version
FROM {schema}.jobs AS j
WHERE j.status = 'pending'
  AND NOT EXISTS (
      SELECT FROM {schema}.workers AS w
      WHERE w.last_seen_at > now() - make_interval(secs => $1::float8)
        AND j.queue = ANY(w.queues)
        AND CASE WHEN j.version = 1 AND strpos(j.type, '@') = 0 THEN j.type
                 ELSE j.type || '@' || j.version END = ANY(w.types))
ORDER BY j.queue, j.type, j.version
