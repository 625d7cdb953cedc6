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


@pytest.fixture(autouse=True)
def _caffe_engine_by_default():
    """Tests exercise the CAFFE engine (the reference kernels) unless they ask for
    another; on a GPU machine the automatic default would otherwise be CUDNN.
    tests/layers/test_cudnn_engine.py sets the engine it tests itself."""
    from minicaffe import engine
    engine.set_default_engine("CAFFE")
    yield
    engine.set_default_engine(None)


@pytest.fixture
def cp():
    """The cupy module (only requested by tests marked gpu)."""
    import cupy
    return cupy


@pytest.fixture
def rng():
    return np.random.default_rng(0)
