"""A view that enqueues a job in its own transaction: the job exists only if the view's writes
commit, so no `transaction.on_commit` is needed."""

from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

import pgworker.sync


@require_POST
def send_invoice(request: HttpRequest, invoice_id: int) -> JsonResponse:
    with transaction.atomic():
        # Invoice.objects.filter(id=invoice_id).update(state="sending") ...
        result = pgworker.sync.enqueue(
            connection,
            "send-invoice",
            {"invoice_id": invoice_id},
            idempotency_key=f"invoice-{invoice_id}-send",
        )
    return JsonResponse({"job_id": result.job.id, "created": result.created}, status=202)
