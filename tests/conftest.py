"""Shared fixtures: the `gpu` marker skips cleanly where no CUDA device answers."""
import numpy as np
import pytest

from minicaffe.backend import gpu_available


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (GPU tests run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cp():
    """The cupy module (only requested by tests marked gpu)."""
    import cupy
    return cupy


@pytest.fixture
def rng():
    return np.random.default_rng(0)
