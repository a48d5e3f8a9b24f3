-- The SQL names of the types $1, in their order.
SELECT format_type(t.oid, NULL) AS name
FROM unnest($1::oid[]) WITH ORDINALITY AS t(oid, n)
ORDER BY t.n
