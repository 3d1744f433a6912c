"""Fixtures of the payment tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def dispatch_shop(mail_folder, make_shop):
    """A shop on the sandbox that holds card payments and captures them when an order ships."""
    return make_shop(sandbox=True, CAPTURE_MODE="dispatch")
