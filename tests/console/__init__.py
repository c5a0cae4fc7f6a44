"""Tests of the approver's console (``ctrlrun serve``)."""
