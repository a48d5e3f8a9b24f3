"""Django's manage.py for the example: run from the repository's root,
`PGWORKER_DSN=postgresql://... python -m examples.django_app.manage pgworker migrate`."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
