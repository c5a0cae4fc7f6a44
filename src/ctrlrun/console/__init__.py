"""The approver's console (``ctrlrun serve``): a web app over the store, its notifier and escalation."""
