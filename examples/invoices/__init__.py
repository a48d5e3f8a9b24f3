"""Seed 003's invoice example: one invoice per order, however often its job runs."""
