"""The command line: the only place that parses arguments, runs the event loop and installs
signal handlers. A user's mistake is one line on stderr and exit status 2, never a traceback.

One module per group of commands (_run, _jobs, _failed, _queues, _health, _serve, _migrate),
each defining its commands' arguments beside the code that runs them; _common holds what they
share, _main assembles the parser (`build_parser`, from which the docs' CLI reference is
generated) and runs `main`, the console script.

argparse, not click or typer: argparse adds no dependency to a library that services embed; the
parser is a table of options whose help states each default and environment variable, which click
would not make shorter (each option is the same one declaration); and the usage texts, the help
and exit status 2 for a mistake are tested as they are, which click would change. What the
commands print is made in _render.py; the logs are configured by `configure_logging`, as an
application embedding a Worker may do.
"""

from ._common import say
from ._main import build_parser, main

__all__ = ["build_parser", "main", "say"]
