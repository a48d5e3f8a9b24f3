-- The rows every claim returns (after _claimed.sql): whole jobs as the claim left them, in
-- claim order. With `claim.synchronous_commit` = 'off' the claim commits without waiting for
-- its WAL flush (see the README, "Fast claims"); with NULL, as the server is configured.
SELECT *
FROM claimed
WHERE (SELECT set_config('synchronous_commit',
                         coalesce(c.synchronous_commit, current_setting('synchronous_commit')),
                         true)
       FROM claim AS c) IS NOT NULL
ORDER BY priority DESC, run_at, id
