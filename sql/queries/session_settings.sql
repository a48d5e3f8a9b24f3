-- The setting a direct pool asks for at connection (plan_cache_mode, a startup parameter): on
-- anything but force_generic_plan, something between the worker and the server dropped it.
SELECT current_setting('plan_cache_mode') AS plan_cache_mode
