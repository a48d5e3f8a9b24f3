"""A handler module that fails at import, as one missing its configuration would."""

import pgworker

registry = pgworker.Registry()

raise RuntimeError("the handlers need SETTINGS_URL")
