"""ps.transport: the ZeroMQ context's I/O threads."""
import os

import pytest
import zmq

from ps import transport


def test_io_threads_one_per_peer_within_half_the_cpus(monkeypatch):
    monkeypatch.delenv(transport.ENV_IO_THREADS, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert [transport.io_threads(n) for n in (0, 1, 4, 8, 30)] == [1, 1, 4, 8, 8]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert transport.io_threads(4) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert transport.io_threads(4) == 1


def test_io_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv(transport.ENV_IO_THREADS, "3")
    assert transport.io_threads(1) == 3
    ctx = transport.context(1)
    try:
        assert ctx.get(zmq.IO_THREADS) == 3
    finally:
        ctx.term()
    for bad, why in (("0", "at least 1"), ("two", "whole number")):
        monkeypatch.setenv(transport.ENV_IO_THREADS, bad)
        with pytest.raises(ValueError, match=why):
            transport.io_threads(1)
