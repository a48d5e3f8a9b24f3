SELECT queue, status, count(*) AS jobs
FROM {schema}.jobs
GROUP BY queue, status
ORDER BY queue, status
