"""ps.transport: the ZeroMQ context's I/O threads."""
import os
import signal
import threading
import time

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



class _SignalledBetweenFrames:
    """A socket whose send_multipart gets SIGTERM after the first frame, as a shard or a
    worker may while a message is half sent.  The kernel gives a process's signal to any
    thread that does not block it (ZeroMQ's I/O threads too), and Python runs the handler in
    the main thread: here another thread takes it, and the send goes on once the handler has
    run (or after 5 s)."""

    def __init__(self, sock):
        self.sock = sock

    def send_multipart(self, frames, flags=0, copy=True):
        for i, f in enumerate(frames):
            more = zmq.SNDMORE if i + 1 < len(frames) else 0
            self.sock.send(f, flags | more, copy=copy)
            if i == 0:
                self._signal_from_another_thread()

    @staticmethod
    def _signal_from_another_thread():
        stop = threading.Event()
        taker = threading.Thread(target=stop.wait, args=(10,))
        taker.start()
        try:
            signal.pthread_kill(taker.ident, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while transport._Sends.held is None and time.monotonic() < deadline:
                time.sleep(0.001)
        finally:
            stop.set()
            taker.join()


def test_a_shard_terminated_during_a_send_sends_the_message_whole_first():
    from ps.server import _install_termination_handler, _Terminated

    assert threading.current_thread() is threading.main_thread()
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    restore = _install_termination_handler()
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        with pytest.raises(_Terminated):
            transport.send(_SignalledBetweenFrames(a), [b"header", b"payload"])
        transport.send(a, [b"abort"])   # what the shard sends next
        assert b.poll(5000)
        assert b.recv_multipart() == [b"header", b"payload"]
        assert b.poll(5000)
        assert b.recv_multipart() == [b"abort"]
    finally:
        restore()
        a.close(linger=0)
        b.close(linger=0)
        ctx.term()


def test_a_handler_outside_a_send_runs_at_once():
    calls = []
    handler = transport.whole_messages(lambda signum, frame: calls.append(signum))
    handler(signal.SIGTERM, None)
    assert calls == [signal.SIGTERM]
