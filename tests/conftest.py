import pytest

from tests.harness import close_session_pool


@pytest.fixture(scope="session", autouse=True)
def _close_pool_at_end():
    yield
    close_session_pool()
