-- The parents $1 (ids in ascending order) of a job about to be enqueued with after=: each is
-- marked as having dependants (so that its end runs the release trigger of migration 19) and
-- its row stays locked until the enqueuing transaction ends. Returns each parent found with its
-- latest status: a parent a worker is finishing is waited for, and its final status read, so
-- that no parent can end between this read and the insert of its dependant. Locked in id order
-- (an index scan of = ANY reads its sorted array in order): two such enqueues never deadlock.
UPDATE {schema}.jobs AS j
SET has_dependants = true
WHERE j.id = ANY($1::bigint[])
RETURNING j.id, j.status
