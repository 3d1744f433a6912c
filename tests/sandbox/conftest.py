"""The sandbox's own tests share one server per module and a real stripe SDK client."""

import pytest
import stripe

from lane_priority import serving
from shop.stripe_sandbox.testing import running_sandbox

MIN_SESSION_SECONDS = 60


@pytest.fixture(scope="module")
def server():
    with serving(lambda: running_sandbox(min_session_seconds=MIN_SESSION_SECONDS)) as handle:
        yield handle


@pytest.fixture
def sandbox(server):
    server.reset()
    return server


@pytest.fixture
def client(sandbox):
    return stripe.StripeClient("sk_test_sandbox", base_addresses={"api": sandbox.base_url}, max_network_retries=0)
