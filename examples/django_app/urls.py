from django.urls import path

from . import views

urlpatterns = [path("invoices/<int:invoice_id>/send", views.send_invoice)]
