"""The database layer: `connection` (pools, held connections, what an error means), `queries`
(one method per file of `sql/queries`: the only code that runs SQL) and `migrations` (the
schema and its checks). `files` reads the `.sql` files."""
