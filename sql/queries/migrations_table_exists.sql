SELECT to_regclass(quote_ident($1) || '.migrations') IS NOT NULL AS present
