"""``python -m ctrlrun``: the ``ctrlrun`` command."""

from .cli import main

main()
