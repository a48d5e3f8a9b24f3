SELECT max(version) AS version FROM {schema}.migrations
