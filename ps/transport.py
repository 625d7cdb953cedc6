"""ZeroMQ plumbing: sockets with bounded sends, CURVE security, link emulation.

Kept apart from the protocol (what bytes mean) and from the server and worker
(what they do with messages), as ps-lite keeps its ``Van`` apart from
``KVServer``/``KVWorker``.

* Servers own one ROUTER; workers own one DEALER per shard.  Every send has a
  timeout (``SNDTIMEO``) and every receive goes through a poller with a
  deadline, so no call can block forever.
* ``ROUTER_MANDATORY``: a reply to a worker that has gone raises instead of
  vanishing silently, so the server can name the rank.
* CURVE (``--curve-dir``): the server proves its identity with its secret key
  and admits only clients whose public key sits in ``authorized/``
  (pyzmq's ``zmq.auth``, the "ironhouse" pattern).
* :class:`LinkModel` delays each message by latency + bytes / bandwidth on the
  sending side, per link, to study a slower network on one host.
* :func:`context`: one ZeroMQ I/O thread per peer socket (up to half the CPUs, at most 8):
  the default context's one I/O thread moves every byte of every socket of the process, and
  ZeroMQ's guide allows one such thread about a gigabyte per second.
"""
from __future__ import annotations

import os
import shutil
import threading
import time

import zmq

from . import env_count
from .protocol import HEADER, frames_nbytes

ENV_IO_THREADS = "MINICAFFE_PS_IO_THREADS"
MAX_IO_THREADS = 8


def io_threads(peers: int) -> int:
    """ZeroMQ I/O threads for a process talking to ``peers`` sockets at once (a worker: its
    shards; a server: its workers): ``$MINICAFFE_PS_IO_THREADS`` when set, else one per peer,
    at most half the CPUs and :data:`MAX_IO_THREADS`, at least 1.  The 4-GPU H200 host moved
    about 1.4 GB/s per worker with one I/O thread (issue 6, session 12); more are not yet
    measured there."""
    n = env_count(ENV_IO_THREADS)
    if n is not None:
        return n
    return max(1, min(int(peers), (os.cpu_count() or 2) // 2, MAX_IO_THREADS))


def context(peers: int):
    """A ZeroMQ context with :func:`io_threads` I/O threads for ``peers`` sockets."""
    return zmq.Context(io_threads=io_threads(peers))


SERVER_KEY = "server"
CLIENT_KEY = "client"
AUTHORIZED = "authorized"


# --------------------------------------------------------------------- CURVE
def create_keys(curve_dir: str, clients=(CLIENT_KEY,)) -> dict:
    """Make a server key pair and client key pairs in ``curve_dir``.

    Layout (``zmq.auth`` certificate files)::

        server.key  server.key_secret       the server's pair: the secret stays on server hosts
        client.key  client.key_secret       a client pair: workers (and NCCL rank 0) load it
        authorized/client.key               public keys the servers admit

    Give the ``server.key`` and a client's pair to worker hosts; keep
    ``server.key_secret`` off them.
    """
    import zmq.auth
    if not zmq.has("curve"):
        raise RuntimeError("this libzmq was built without CURVE support")
    auth_dir = os.path.join(curve_dir, AUTHORIZED)
    os.makedirs(auth_dir, exist_ok=True)
    out = {}
    out["server"] = zmq.auth.create_certificates(curve_dir, SERVER_KEY)
    for name in clients:
        public, secret = zmq.auth.create_certificates(curve_dir, name)
        shutil.copy(public, os.path.join(auth_dir, os.path.basename(public)))
        out[name] = (public, secret)
    return out


def _load(curve_dir, name, secret: bool):
    import zmq.auth
    path = os.path.join(curve_dir, name + (".key_secret" if secret else ".key"))
    if not os.path.exists(path):
        raise FileNotFoundError(f"CURVE key {path} not found (make keys with "
                                f"`minicaffe ps keys --curve-dir {curve_dir}`)")
    return zmq.auth.load_certificate(path)


class _AuthLog:
    """A ``logging.Logger`` stand-in for the authenticator thread: refusals
    and errors become warnings in the server's log, the rest is dropped."""

    def __init__(self, where: str):
        self.where = where

    def _emit(self, text):
        from minicaffe.log import log
        log(f"CURVE: {text}", level="W", where=self.where)

    @staticmethod
    def _format(fmt, args):
        try:
            return str(fmt) % args if args else str(fmt)
        except (TypeError, ValueError):
            return " ".join([str(fmt)] + [str(a) for a in args])

    def debug(self, fmt, *args, **kw):
        text = self._format(fmt, args)
        if text.startswith("DENIED"):
            self._emit(f"refused a client: {text}")

    def info(self, fmt, *args, **kw):
        pass

    def warning(self, fmt, *args, **kw):
        self._emit(self._format(fmt, args))

    error = exception = critical = warn = warning


class CurveServer:
    """The authenticator thread of one context plus the server's key pair."""

    def __init__(self, ctx, curve_dir: str, where: str = "ps.server"):
        from zmq.auth.thread import ThreadAuthenticator
        auth_dir = os.path.join(curve_dir, AUTHORIZED)
        if not os.path.isdir(auth_dir):
            raise FileNotFoundError(f"{auth_dir}: no authorized client keys (make keys with "
                                    f"`minicaffe ps keys --curve-dir {curve_dir}`)")
        self.public, self.secret = _load(curve_dir, SERVER_KEY, secret=True)
        self.auth = ThreadAuthenticator(ctx, log=_AuthLog(where))
        self.auth.start()
        self.auth.configure_curve(domain="*", location=auth_dir)

    def apply(self, sock):
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def stop(self):
        self.auth.stop()


def apply_curve_client(sock, curve_dir: str, name: str = CLIENT_KEY):
    public, secret = _load(curve_dir, name, secret=True)
    server_public, _ = _load(curve_dir, SERVER_KEY, secret=False)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


# ------------------------------------------------------------------- sockets
def _common(sock, max_frame_bytes: int, send_timeout_s: float, linger_s: float):
    # A memory guard: libzmq drops a peer that sends a frame above this before
    # allocating it.  Frames between max_frame_bytes and the guard reach the
    # protocol check, which rejects them with a logged reason.
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * max_frame_bytes + HEADER.size)
    sock.setsockopt(zmq.SNDTIMEO, max(1, int(send_timeout_s * 1000)))
    sock.setsockopt(zmq.LINGER, max(0, int(linger_s * 1000)))


def router(ctx, bind: str, *, max_frame_bytes: int, send_timeout_s: float, curve=None):
    """A bound ROUTER; returns (socket, the endpoint actually bound).

    ``bind`` may end in ``:*`` (or ``:0``) for a free port; the endpoint read
    back names it.
    """
    sock = ctx.socket(zmq.ROUTER)
    _common(sock, max_frame_bytes, send_timeout_s, linger_s=send_timeout_s)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if curve is not None:
        curve.apply(sock)
    if bind.endswith(":0"):
        bind = bind[:-2] + ":*"
    try:
        sock.bind(bind)
    except zmq.ZMQError as e:
        sock.close(0)
        raise RuntimeError(f"cannot bind {bind}: {e}") from None
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def dealer(ctx, endpoint: str, *, max_frame_bytes: int, send_timeout_s: float, curve_dir=None,
           monitor_events: int = 0):
    """A connected DEALER; with ``monitor_events``, returns (socket, monitor
    socket), the monitor attached before connecting so that no event is missed."""
    sock = ctx.socket(zmq.DEALER)
    _common(sock, max_frame_bytes, send_timeout_s, linger_s=min(send_timeout_s, 1.0))
    if curve_dir:
        apply_curve_client(sock, curve_dir)
    monitor = sock.get_monitor_socket(monitor_events) if monitor_events else None
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as e:
        if monitor is not None:
            sock.disable_monitor()
            monitor.close(0)
        sock.close(0)
        raise RuntimeError(f"cannot connect to {endpoint}: {e}") from None
    return (sock, monitor) if monitor_events else sock


class _Sends:
    """How deep the main thread is in :func:`send`, and a signal handler held until it is out."""
    depth = 0
    held = None


def whole_messages(handler):
    """``handler`` as a signal handler that waits while the main thread is inside :func:`send`.

    ``send_multipart`` sends frame after frame from Python.  A handler that raises between
    two frames (the server's and the worker's SIGTERM handlers do) leaves a half-sent message,
    and ZeroMQ appends the next send of the socket (the ABORT that follows) to it: the peer reads
    one malformed message instead of the ABORT.  Python runs every handler in the main thread,
    whichever thread the kernel gave the signal to (ZeroMQ's I/O threads take it too), so a
    signal mask cannot hold it back; this wrapper holds the call until the message is whole.
    """
    def held_while_sending(signum, frame):
        if _Sends.depth:
            _Sends.held = (handler, signum, frame)
        else:
            handler(signum, frame)
    return held_while_sending


def send(sock, frames, routing_id: bytes | None = None, flags: int = 0):
    """Send one message without copying its buffers (raises zmq.Again on timeout), whole:
    a handler made by :func:`whole_messages` runs after its last frame."""
    if routing_id is not None:
        frames = [routing_id] + list(frames)
    if threading.current_thread() is not threading.main_thread():
        sock.send_multipart(frames, flags=flags, copy=False)   # handlers never run here
        return
    _Sends.depth += 1
    try:
        sock.send_multipart(frames, flags=flags, copy=False)
    finally:
        _Sends.depth -= 1
        held = _Sends.held if _Sends.depth == 0 else None
        if held is not None:
            _Sends.held = None
            handler, signum, frame = held
            handler(signum, frame)


# ----------------------------------------------------------- link emulation
class LinkModel:
    """Emulated links: each message leaves ``latency + bytes / bandwidth``
    after its link is free, measured on the sending side.

    A link is one (sender, receiver) pair, keyed by the caller.  Messages on
    one link queue behind each other (its bandwidth is shared); different
    links run in parallel.  A sender's network card shared by several links
    is not modelled: with S shards and W workers on separate hosts, one
    server host sends W replies through one card, so real 10 GbE can be up
    to W times slower than this model for the replies.

    ``gbps`` None (or 0) disables the bandwidth term, ``latency_ms`` 0 the
    latency; with both off, :meth:`send_all` sends at once.
    """

    def __init__(self, gbps: float | None = None, latency_ms: float = 0.0,
                 clock=time.perf_counter, sleep=time.sleep):
        if gbps is not None and gbps < 0:
            raise ValueError(f"link bandwidth must be positive, got {gbps} Gb/s")
        if latency_ms < 0:
            raise ValueError(f"link latency must be >= 0, got {latency_ms} ms")
        self.bytes_per_s = gbps * 1e9 / 8 if gbps else None
        self.latency_s = latency_ms / 1e3
        self._clock = clock
        self._sleep = sleep
        self._free_at: dict = {}

    @property
    def enabled(self) -> bool:
        return self.bytes_per_s is not None or self.latency_s > 0

    def busy_time(self, nbytes: int) -> float:
        """Seconds a message of ``nbytes`` occupies its link (without latency)."""
        return nbytes / self.bytes_per_s if self.bytes_per_s else 0.0

    def schedule(self, sends):
        """Departure times: ``sends`` are (link key, nbytes); returns the due
        time of each, in order (pure bookkeeping, testable without sockets)."""
        now = self._clock()
        due = []
        for key, nbytes in sends:
            start = max(now, self._free_at.get(key, 0.0))
            end = start + self.busy_time(nbytes)
            self._free_at[key] = end
            due.append(end + self.latency_s)
        return due

    def wait_time(self, due: float) -> float:
        """Seconds until ``due`` (a time :meth:`schedule` returned); <= 0 once past."""
        return due - self._clock()

    def sleep(self, seconds: float):
        self._sleep(seconds)

    def send_all(self, sends):
        """Send every message of ``sends`` = [(link key, socket, frames, routing id)],
        each at its emulated arrival time (earliest first).

        A message that cannot leave does not stop the others; once all were
        tried, :class:`SendFailed` names every link that failed.
        """
        if self.enabled:
            due = self.schedule([(key, frames_nbytes(frames)) for key, _, frames, _ in sends])
            timed = sorted(zip(due, sends), key=lambda x: x[0])
        else:
            timed = [(None, s) for s in sends]
        failed = []
        for t, (key, sock, frames, rid) in timed:
            rest = None if t is None else t - self._clock()   # read the clock once: a
            if rest is not None and rest > 0:                   # second read may be past t
                self._sleep(rest)
            try:
                send(sock, frames, rid)
            except zmq.ZMQError as e:
                failed.append((key, e))
        if failed:
            raise SendFailed(failed)


class SendFailed(zmq.ZMQError):
    """Some messages of one :meth:`LinkModel.send_all` could not leave.

    ``failures`` is [(link key, zmq.ZMQError)], in sending order; ``errno``
    is the first failure's, so a caller that catches ``zmq.Again`` by errno
    still can.
    """

    def __init__(self, failures):
        self.failures = list(failures)
        first = self.failures[0][1]
        super().__init__(first.errno, "; ".join(f"{key}: {e}" for key, e in self.failures))

    @property
    def keys(self) -> list:
        return [key for key, _ in self.failures]


def poll_until(poller, deadline: float) -> list:
    """One poll bounded by ``deadline`` (time.monotonic()); [] once it is past."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return []
    # Short slices keep signal handlers (SIGTERM) responsive.
    return poller.poll(timeout=min(remaining, 0.2) * 1000)
