"""``python -m ctrlrun.cli``: the same as the ``ctrlrun`` script."""

from . import main

main()
