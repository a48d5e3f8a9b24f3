-- The W3C traceparent of the span that was active when the job was enqueued (NULL when none
-- was): each attempt's span links to it. Nullable without a default, so adding it rewrites
-- nothing; no index, nothing looks jobs up by it.
ALTER TABLE {schema}.jobs ADD COLUMN traceparent text;
