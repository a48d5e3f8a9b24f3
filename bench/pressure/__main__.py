"""`python -m bench.pressure`: see bench/pressure/__init__.py."""

import sys

from bench.pressure.harness import main

sys.exit(main())
