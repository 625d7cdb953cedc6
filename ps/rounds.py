"""A worker's BSP round on a thread of its own (issue 6): pushes leave when the GPU is
done with a bucket, not when the host thread passes by.

With overlap (ps/overlap.py) a bucket may go once its gradients are on the host.  Session
14's worker pushed between backward layers, from the main thread, so a bucket left when the
*host* reached the next layer after its copy had finished.  A host that issues backward
ahead of the GPU (its kernels queue up; the executor waits only for memory) reaches the end
of backward first, then waits for the GPU at the update, and every bucket left after that:
on 4 H200s (2026-11-22, session 15, call 1) ResNet-101 at W = 1 had none of its 179 MB of
answers back before the update.

:class:`RoundThread` owns the parameter-server client between the join and the close (ZeroMQ
sockets belong to one thread).  The main thread hands it each bucket as backward makes it
ready (:meth:`bucket`: its id and the event of its device-to-host copy), then, at the
update, asks for the end of the round (:meth:`finish`).  The thread pushes the buckets in
order, each as soon as its copy is done (it waits on the copy's event, off the GIL), takes the answers as they come
(``take_early`` before the update, ``take_late`` after), and at the update pushes what is
left and waits for the answers still out, within the client's timeouts.  A failure (a
peer's ABORT, a timeout, a malformed answer) ends the thread and is raised on the main
thread by the next :meth:`bucket` or :meth:`finish`, naming the peer as before.

The thread never spins: between buckets it sleeps in one ZeroMQ poll on the client's
sockets, their monitors and a pipe that :meth:`bucket`, :meth:`finish` and :meth:`stop`
write a byte to (and, with an emulated link, until the next queued push is due).  A
spinning thread would take the GIL from the main thread, which issues the kernels.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque

# the longest sleep between looks while a round is open (a wake-up byte or an answer ends
# it sooner); a stuck round is caught by the client's own deadlines at the update
IDLE_POLL_MS = 1000


class RoundThread:
    """Args:
        client: a joined :class:`ps.worker.ParameterClient` (this thread's from now on).
        shard_of: the shard of each bucket.
        payloads: ``payloads(g, done)`` -> [(blob id, host array)] of bucket g, once its
            copy is done.
        take_early, take_late: ``take(blob id, array)`` for each answered blob, before and
            after the update asked for the end of the round.
        device: a ``cupy.cuda.Device`` to use on the thread (GPU), or None.
    """

    def __init__(self, client, shard_of, payloads, take_early, take_late, device=None):
        import zmq
        self.client = client
        self.shard_of = list(shard_of)
        self.payloads = payloads
        self.take_early = take_early
        self.take_late = take_late
        self.device = device
        self._jobs: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._failed = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._poller = zmq.Poller()
        for sock in list(client.socks) + list(client.monitors):
            self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name="ps-round", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ main thread
    def _hand(self, job):
        self._jobs.put(job)
        try:
            os.write(self._wake_w, b"x")
        except OSError:   # pragma: no cover - the pipe is full: the thread is awake anyway
            pass

    def bucket(self, iteration: int, g: int, done=None):
        """Bucket g of this round is ready: its gradients are on the host once ``done``
        (a CUDA event; None: already)."""
        self._raise_if_failed()
        self._hand(("bucket", iteration, g, done))

    def finish(self, iteration: int) -> tuple:
        """Push what is left, take every answer; returns (bytes pushed, bytes pulled,
        {"push_s", "pull_wait_s"}: from this call to the last push, and from there to the
        last answer)."""
        self._raise_if_failed()
        self._hand(("finish", iteration, None, None))
        while True:
            try:
                got = self._results.get(timeout=0.5)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the parameter-server round thread ended without an "
                                       "answer") from None
                continue
            if isinstance(got, BaseException):
                self._failed = got
                raise got
            return got

    def stop(self, timeout: float = 5.0) -> bool:
        """End the thread; False if it is still busy (a wait it cannot leave early)."""
        self._hand(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._wake_r = self._wake_w = -1
        return True

    def _raise_if_failed(self):
        if self._failed is None:
            try:
                got = self._results.get_nowait()
            except queue.Empty:
                return
            if not isinstance(got, BaseException):   # pragma: no cover - a bug
                raise RuntimeError("a round's result came before its finish")
            self._failed = got
        raise self._failed

    # ------------------------------------------------------------ the thread
    def _sleep(self):
        """Until an answer, a monitor event or a handed job arrives, or the next emulated
        push is due."""
        due = self.client.next_send_s()
        timeout = IDLE_POLL_MS if due is None else max(0.0, min(IDLE_POLL_MS, 1e3 * due))
        self._poller.poll(timeout)
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _run(self):
        if self.device is not None:
            self.device.use()
        pending: deque = deque()       # (g, done) in the order backward made them ready
        t = None                       # the open round's iteration
        finish_t0 = None               # when the update asked for the end of the round
        last_push_t = None             # time.monotonic() when the round's last push began: a
        #                                shard reads it after that, never before (read_lag_s)
        pushed = 0
        while True:
            try:
                if t is None:
                    job = self._jobs.get()                 # no round open: nothing to do
                else:
                    job = self._jobs.get_nowait()
            except queue.Empty:
                job = ()
            try:
                while job:                                 # every job handed over so far
                    kind, t, g, done = job
                    if kind == "bucket":
                        pending.append((g, done))
                    else:
                        finish_t0 = time.perf_counter()
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        job = ()
                if job is None:
                    return
                while pending:
                    g, done = pending.popleft()
                    if done is not None:
                        done.synchronize()                 # off the GIL: the copy ends
                    began = time.monotonic()
                    pushed += self.client.push(t, self.shard_of[g], self.payloads(g, done))
                    last_push_t = began
                    if finish_t0 is None:
                        self.client.receive_ready(t, self.take_early)
                if t is None:
                    continue
                if finish_t0 is None:
                    began = time.monotonic()
                    if self.client.send_due(wait=False):
                        last_push_t = began
                    self.client.receive_ready(t, self.take_early)
                    self._sleep()
                    continue
                began = time.monotonic()
                if self.client.send_due(wait=True):    # an emulated link's queue
                    last_push_t = began
                t_pushed = time.perf_counter()
                pulled = self.client.pull(t, self.take_late)
                parts = {"push_s": t_pushed - finish_t0,
                         "pull_wait_s": time.perf_counter() - t_pushed}
                if last_push_t is not None:   # the shards' stats hold when they read it
                    parts["last_push_t"] = last_push_t
                self._results.put((pushed, pulled, parts))
                t, finish_t0, pushed, last_push_t = None, None, 0, None
            except BaseException as e:
                self._results.put(e)
                return
