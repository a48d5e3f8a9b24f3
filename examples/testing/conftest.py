"""The root conftest.py of the example suite: pytest accepts `pytest_plugins` only here."""

from collections.abc import AsyncIterator

import asyncpg
import pytest
import shop

pytest_plugins = ["pgworker.testing"]


@pytest.fixture(autouse=True)
def empty_outbox() -> None:
    shop.outbox.clear()
    shop.mail_down_for = 0


@pytest.fixture
async def db(pgworker_conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """The scratch database (pgworker's tables emptied by the plugin) with the shop's table,
    empty."""
    await pgworker_conn.execute(shop.SCHEMA)
    await pgworker_conn.execute("TRUNCATE orders")
    yield pgworker_conn
