-- pgworker.testing: the scratch database of a test session; {database} is a name the plugin
-- made (pgworker_test_ and hex digits), checked as a plain identifier.
CREATE DATABASE {database}
