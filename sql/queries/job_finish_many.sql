-- Write a batch of attempt outcomes (see _job_finish.sql); returns the ids written.
WITH {job_finish}
SELECT id FROM done
