"""Fixtures of the layer tests."""
import gc
import threading
import time

import pytest


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("minicaffe-prefetch")]


@pytest.fixture
def no_leftover_prefetch_threads():
    """After the test, every data layer's prefetch thread has ended (within 5 s)."""
    yield
    gc.collect()
    deadline = time.time() + 5
    while prefetch_threads() and time.time() < deadline:
        time.sleep(0.01)
    assert not prefetch_threads(), "a prefetch thread outlived its test"
