"""The approver's console (``ctrlrun serve``): a small web application over the operator's store.

Needs the ``console`` extra; ``import ctrlrun`` never imports this package.
"""
