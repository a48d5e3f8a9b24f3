"""Durable steps (`ctx.step`): their records (store) and the connection a transactional step
runs on, whose transaction control is refused (connection)."""
