"""Handlers whose errors carry secrets, served by `pgworker run tests.apps.secrets` in
tests/test_redaction.py."""

import json

import pgworker

registry = pgworker.Registry()

FAST = pgworker.RetryPolicy(max_retries=1, initial_delay=0.01, max_delay=0.01, jitter=0)


@registry.task("login", retry=FAST)
async def login(ctx: pgworker.JobContext, p: dict) -> None:
    raise ValueError(f"login failed password={p['password']} via postgresql://u:pw-789@db/x")


@registry.task("leaky", retry=FAST)
def leaky(ctx: pgworker.JobContext, p: dict) -> None:
    """Secrets in every form a message may show them: the payload dumped, a header, a nested
    key's value on its own, on a second line of the message and in the chained cause."""
    try:
        raise KeyError(f"the vault said no to {p['nested']['client_secret']}")
    except KeyError as cause:
        raise RuntimeError(
            f"call failed: {json.dumps(p)} with Authorization: Bearer {p['api_key']}\n"
            f"second line: {p['api_key']} and {p!r}"
        ) from cause
