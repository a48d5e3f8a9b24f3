-- A pending job whose `attempts` is behind its recorded attempts (an operator reset it): number
-- its next attempt after its last recorded one, so that the claim's attempt row is new.
UPDATE {schema}.jobs AS j
SET attempts = (SELECT max(a.attempt) FROM {schema}.job_attempts AS a WHERE a.job_id = j.id)
WHERE j.id = $1 AND j.status = 'pending'
  AND j.attempts < (SELECT max(a.attempt) FROM {schema}.job_attempts AS a WHERE a.job_id = j.id)
