-- The ids of the bulk actions still running (to resume), oldest first.
SELECT id FROM {schema}.bulk_actions WHERE state = 'running' ORDER BY id
