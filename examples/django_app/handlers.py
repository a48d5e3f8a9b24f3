"""The tasks the worker runs: `pgworker run examples.django_app.handlers`, or
`python -m examples.django_app.manage pgworker run examples.django_app.handlers`. Django is set
up first, so that a plain `def` handler (run in a worker thread) may use the ORM."""

from __future__ import annotations

import os
from typing import Any

import django

import pgworker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
django.setup()

registry = pgworker.Registry()


@registry.task("send-invoice", max_retries=5)
def send_invoice(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:  # the ORM works here: Invoice.objects.get(...)
        cursor.execute("SELECT %s::int", [payload["invoice_id"]])
        (invoice_id,) = cursor.fetchone()
    connection.close()  # this thread's connection: close it, Django will not
    return {"sent": invoice_id}
