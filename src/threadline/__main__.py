"""``python -m threadline``: the same as the ``threadline`` command."""

from threadline.cli import run

run()
