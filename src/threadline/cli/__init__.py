"""The ``threadline`` command: a terminal chat and tools for saved conversations.

See docs/cli.md. ``main(argv)`` runs the command and returns its exit status;
``run()`` is the console-script entry point.
"""

from threadline.cli._app import main, run
from threadline.cli._options import parser
from threadline.cli._setup import build_driver

__all__ = ["build_driver", "main", "parser", "run"]
