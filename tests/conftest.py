import pytest
import torch

from tests.harness import close_session_pool


@pytest.fixture(scope="session", autouse=True)
def _close_pool_at_end():
    yield
    close_session_pool()


@pytest.fixture(autouse=True)
def _one_thread():
    """In-process tensors are tiny on a shared 2-core machine: extra threads only fight each other
    (and ranks already run with one thread each)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
