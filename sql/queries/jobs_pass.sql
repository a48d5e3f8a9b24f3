-- Pass a turn on: a notification of new jobs of queue $1 sent again (jobs_notification,
-- migration 0028), for the workers from position $2 on, $3 jobs, of the type $4 when the first
-- had one ($4 = $5), passed on for the $6th time.
SELECT pg_notify({jobs_channel},
                 {schema}.jobs_notification($1::text, $2::bigint, $3::bigint, $4::text, $5::text,
                                            $6::integer))
