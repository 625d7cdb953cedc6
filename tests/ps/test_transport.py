"""ps.transport: the ZeroMQ context's I/O threads."""
import os
import signal

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


class _Stop(BaseException):
    pass


class _KilledBetweenFrames:
    """A socket whose send_multipart sends itself SIGTERM after the first frame,
    as the server's handler may fire while a reply is half sent."""

    def __init__(self, sock):
        self.sock = sock

    def send_multipart(self, frames, flags=0, copy=True):
        for i, f in enumerate(frames):
            more = zmq.SNDMORE if i + 1 < len(frames) else 0
            self.sock.send(f, flags | more, copy=copy)
            if i == 0:
                os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_during_a_send_waits_until_the_message_is_whole():
    def handler(signum, frame):
        raise _Stop()

    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    old = signal.signal(signal.SIGTERM, handler)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        with pytest.raises(_Stop):
            transport.send(_KilledBetweenFrames(a), [b"header", b"payload"])
        transport.send(a, [b"abort"])   # what the server sends next
        assert b.poll(5000)
        assert b.recv_multipart() == [b"header", b"payload"]
        assert b.poll(5000)
        assert b.recv_multipart() == [b"abort"]
    finally:
        signal.signal(signal.SIGTERM, old)
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()
