"""Workers of data-parallel training: a Solver whose update step is a BSP round.

A worker runs the ordinary minicaffe :class:`~minicaffe.solver.Solver` loop
(test, forward/backward ``iter_size`` times, display, snapshot) and replaces
only its ``apply_update``: instead of updating locally it pushes the
gradients to every server shard, then waits for the shards' new parameters
and copies them into the net.  The update itself (learning rate, momentum,
weight decay...) happens on the shards, with the solver's own code
(:mod:`ps.update`).  Caffe's own multi-GPU ``P2PSync`` hooks the solver at the
same place (``on_gradients_ready``).

Data: worker ``r`` of ``W`` must see the ``r``-th slice of the big batch that
one worker at batch ``W x k`` would see, so that W workers at batch k train
like one worker at batch W x k (gradients are averaged).  :class:`RankSlicer`
does that for every data layer: of each ``W`` consecutive batches the layer
produces, worker ``r`` keeps the ``r``-th (Caffe's ``DataLayer::Skip`` rule,
per batch).  The cost is that each worker reads W batches per iteration; a
data layer with a cheap ``skip`` would remove it.  ``Input`` layers are fed
by a data hook instead (``hook(solver, rank, world_size)`` before each
iteration).

Overlap (on by default; ``--no-overlap``, ``PSConfig.overlap``,
``MINICAFFE_PS_OVERLAP=0`` turn it off).  Without it every shard is pushed
after backward, in one message, and answered in one.  With it (:mod:`ps.overlap`)
the blobs are cut, in the order backward finishes them, into buckets of at most
``--bucket-mb`` (default 8 MiB), dealt round the shards
(:func:`ps.sharding.assign_buckets`).  Each bucket is pushed as soon as its last
gradient is final, and its shard answers it as soon as every worker has pushed
it, while backward goes on with the layers below::

    backward  [layer L ... layer j][layer j-1 ... layer i][layer i-1 ... 0]   update
    bucket 0                      ^ ready: (GPU) the copy stream waits on the
                                    compute event, copies the bucket's diffs to
                                    pinned memory; the round thread pushes
                                    it when the copy is done
    bucket 0's PARAMS                           ^ taken by the round thread: its
                                                  blobs' backward is over
    bucket 1                                             ^ ready ...
                                                                 flush, take the rest

Between the join and the close the client belongs to a round thread
(:mod:`ps.rounds`): the backward hook hands it each bucket with the event of its
device-to-host copy, and the thread pushes the bucket as soon as the copy is done
(whatever the main thread is doing: a host that issues backward ahead of the GPU
no longer holds the pushes back), takes the answers as they come, and at the
update pushes what is left and waits for the answers still out.  An emulated
link's push is queued until its due time instead of sleeping.  Where the answers
go into the net is the copy-up mode (:mod:`ps.copyup`): on the GPU by default
during the next forward, each layer waiting for its own buckets, because during
backward the host-to-device link carries the swap plan's prefetches; on the CPU
as they come.  So the backward never blocks on the network or a copy.  The
servers' arithmetic (sum in rank order, 1/W, the update of each blob) and the
BSP rounds are those of the path without overlap, so the parameters are
identical bit for bit; only the blobs' placement on the shards differs.

Timing (AccUDNN eq. (3), ``t_whole = E m / k [t_iter(k) + Delta]``): the
worker measures per iteration ``compute`` (from the end of one
synchronisation to the start of the next: forward/backward, test, display)
and ``Delta`` (the synchronisation: device-to-host copies, push, waiting for
every shard, host-to-device copies).  Both go to ``stats`` (and to
``stats_path`` as JSON lines); the display line reports their ratio.  With
overlap, what communication hides under backward counts in ``compute`` (the
pushes sent between layers included); Delta is what the update still waits for.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from minicaffe.backend import is_gpu_array, to_numpy
from minicaffe.log import log
from minicaffe.proto import caffe_pb2

from . import protocol as P
from .copyup import CopyError, CopyUp, copy_up_mode, driver_copies, forward_needs
from .overlap import (DEFAULT_PS_BUCKET_MB, DEFAULT_PS_TAIL_MB, PS_TAIL_BUCKET_MB,
                      GradientOverlap, backward_order, make_buckets, overlap_default)
from .protocol import Op, ProtocolError
from .rounds import RoundThread
from .sharding import assign_buckets, assign_shards, bucket_cap, shard_bytes
from .shm import WorkerSegments
from .transport import LinkModel, SendFailed, context, dealer, poll_until, send, whole_messages


class PSError(RuntimeError):
    """A data-parallel round failed (a peer died, timed out, aborted or
    rejected us); ``str()`` names the rank or shard."""


@dataclass
class PSConfig:
    """How a worker reaches its servers (``minicaffe train --ps ...`` options).

    endpoints: one ZeroMQ endpoint per shard, in shard order.
    timeout: seconds the servers wait for the slowest worker; a worker waits
        that long plus a grace period (so that a server's report naming the
        missing rank arrives before the worker gives up on the server).
    stats_path: optional JSON-lines file of per-iteration timings.
    overlap: push each shard as soon as backward has finished its gradients
        (default ``$MINICAFFE_PS_OVERLAP``, on); False: after backward.
    """

    endpoints: list
    rank: int = 0
    world_size: int = 1
    timeout: float = 120.0
    link_gbps: float | None = None
    link_latency_ms: float = 0.0
    curve_dir: str | None = None
    max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES
    stats_path: str | None = None
    overlap: bool = field(default_factory=overlap_default)
    bucket_mb: float | None = None    # with overlap: MiB per bucket (DEFAULT_PS_BUCKET_MB)
    copy_up: str | None = None        # with overlap: ps.copyup mode (None: the default)
    tail_mb: float | None = None      # with overlap: the last MiB of backward in 1 MiB buckets
                                      # (None: DEFAULT_PS_TAIL_MB)
    shm: bool = False                 # values through shared memory (ps/shm.py; one host)

    def validate(self):
        if self.world_size < 1:
            raise ValueError(f"--world-size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"--rank {self.rank} out of range for --world-size {self.world_size}")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be positive, got {self.timeout}")
        if not self.endpoints:
            raise ValueError("--ps needs at least one endpoint (tcp://host:port)")
        if self.bucket_mb is not None and self.bucket_mb <= 0:
            raise ValueError(f"--bucket-mb must be positive, got {self.bucket_mb}")
        if self.tail_mb is not None and self.tail_mb < 0:
            raise ValueError(f"--tail-mb must be at least 0, got {self.tail_mb}")
        if self.shm and (self.link_gbps or self.link_latency_ms):
            raise ValueError("--ps-shm moves the values through shared memory, which link "
                             "emulation cannot delay: drop --link-gbps/--link-latency-ms")

    @property
    def grace(self) -> float:
        return max(1.0, 0.25 * self.timeout)


def parse_endpoints(spec: str) -> list:
    """``tcp://h1:p1,tcp://h2:p2`` -> list (a bare ``host:port`` means tcp)."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        out.append(part if "://" in part else f"tcp://{part}")
    if not out:
        raise ValueError(f"no endpoint in {spec!r} (expected tcp://host:port[,tcp://host:port...])")
    return out


# --------------------------------------------------------------- the client
class ParameterClient:
    """One DEALER per shard, and the two exchanges of BSP: join and push/pull.

    Pushes to all shards go out first, then the replies are collected in
    whatever order they come, so the shards' transfers and updates overlap.
    """

    def __init__(self, config: PSConfig, shards: list, buckets: list | None = None,
                 segments: WorkerSegments | None = None):
        import zmq
        self._zmq = zmq
        self.config = config
        self.segments = segments      # --ps-shm: the values' segments
        self.shards = shards          # blob ids per shard
        # per shard, its buckets (sorted blob ids each); default: one bucket, the shard
        self.buckets = [[list(ids)] for ids in shards] if buckets is None else buckets
        self._expect([], None)
        self.link = LinkModel(config.link_gbps, config.link_latency_ms)
        self.ctx = context(len(shards))
        self.socks = []
        self.monitors = []
        self.poller = zmq.Poller()
        # Connection events per shard: a server that dies closes its TCP
        # connections, and a CURVE refusal fails the handshake; both are
        # reported at once instead of after the timeout.
        self._lost: dict = {}     # shard -> (monotonic time, what happened, handshake failed)
        events = (zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                  | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        try:
            for ep in config.endpoints:
                s, m = dealer(self.ctx, ep, max_frame_bytes=config.max_frame_bytes,
                              send_timeout_s=config.timeout, curve_dir=config.curve_dir,
                              monitor_events=events)
                self.socks.append(s)
                self.monitors.append(m)
                self.poller.register(s, zmq.POLLIN)
                self.poller.register(m, zmq.POLLIN)
        except BaseException:
            self.close()
            raise
        self.index = {s: i for i, s in enumerate(self.socks)}
        self.monitor_index = {m: i for i, m in enumerate(self.monitors)}
        self._due: list = []      # emulated link: (due time, shard, frames) pushed later

    def name(self, s: int) -> str:
        return f"shard {s} ({self.config.endpoints[s]})"

    def _send(self, op, iteration, payloads_by_shard):
        """Send one message per shard; returns the bytes sent."""
        c = self.config
        sends = []
        for s, payloads in payloads_by_shard:
            frames = P.encode(op, iteration, c.rank, s, payloads)
            if not self.link.enabled:  # no emulation: this shard's transfer starts now
                self._send_one(s, frames)
            sends.append((("push", s), self.socks[s], frames, None))
        if self.link.enabled:
            try:
                self.link.send_all(sends)
            except SendFailed as e:
                shards = ", ".join(self.name(s) for _, s in e.keys)
                if all(isinstance(err, self._zmq.Again) for _, err in e.failures):
                    raise PSError(f"iteration {iteration}: sending to {shards} timed out after "
                                  f"{c.timeout:g} s (server down?)") from None
                raise PSError(f"iteration {iteration}: cannot send to {shards}: "
                              f"{e.failures[0][1]}") from None
        return sum(P.frames_nbytes(f) for _, _, f, _ in sends)

    def _send_one(self, s, frames):
        try:
            send(self.socks[s], frames)
        except self._zmq.Again:
            raise PSError(f"{self.name(s)}: {self._why_unsent(s)}") from None

    def _why_unsent(self, s) -> str:
        """Why a send to shard s timed out: what its connection monitor has said meanwhile
        (a refused CURVE handshake leaves the socket without a peer, so the send blocks until
        its timeout; the monitor's event is only read while receiving), else the timeout."""
        mon = self.monitors[s]
        while mon.poll(0):
            self._on_monitor_event(mon)
        lost = self._lost.get(s)
        if lost is not None:
            return lost[1]
        return f"sending timed out after {self.config.timeout:g} s (server down?)"

    # A disconnect is only fatal once a shard's answer has had time to be read:
    # at the end of training the servers close right after their last reply.
    LOST_GRACE_S = 0.5

    def _on_monitor_event(self, mon):
        from zmq.utils.monitor import recv_monitor_message
        ev = recv_monitor_message(mon)["event"]
        s = self.monitor_index[mon]
        zmq = self._zmq
        if ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._lost.pop(s, None)
        elif ev == zmq.EVENT_DISCONNECTED:
            # a refused handshake is followed by a disconnect: keep the first reason
            if s not in self._lost or not self._lost[s][2]:
                self._lost[s] = (time.monotonic(), "closed the connection (server process ended?)",
                                 False)
        elif s not in self._lost or not self._lost[s][2]:   # retries repeat it: keep the first
            self._lost[s] = (time.monotonic(), "refused the connection handshake (CURVE: is this "
                                               "client's key in the server's authorized/ folder, "
                                               "and is server.key the server's?)", True)

    def _waiting_note(self, exclude) -> str:
        rest = sorted(s for s, keys in self._waiting.items() if keys and s != exclude)
        if not rest:
            return ""
        return "; still waiting for " + ", ".join(self.name(s) for s in rest)

    def _expect(self, keys_by_shard, expect_iteration, round_of=None):
        """From now on, PARAMS messages carrying exactly the blobs of one of
        ``keys_by_shard[s]`` (tuples of blob ids) are due from shard s, each once, all
        of iteration ``expect_iteration`` (None: whatever the servers are at, all alike)."""
        self._waiting = {s: set(keys) for s, keys in enumerate(keys_by_shard)}
        self._expect_iter = expect_iteration
        self._got_iter = None
        self._pulled = 0
        self._round = round_of

    def _receive(self, iteration: int, on_params, deadline: float | None):
        """Take the due PARAMS messages: all of them before ``deadline``
        (time.monotonic(); PSError when it passes first), or with ``deadline`` None
        only those that have arrived already (never waits).  ``on_params(blob id,
        array)`` gets every blob."""
        while any(self._waiting.values()):
            if deadline is None:
                events = self.poller.poll(0)
                if not events:
                    return
            else:
                events = poll_until(self.poller, deadline)
            now = time.monotonic()
            if not events and deadline is not None and now >= deadline:
                names = ", ".join(self.name(s) for s, k in sorted(self._waiting.items()) if k)
                raise PSError(f"iteration {iteration}: no answer from {names} within "
                              f"{self._timeout:g} s (server down, stopped or unreachable)")
            for sock, _ in events:
                if sock in self.monitor_index:
                    self._on_monitor_event(sock)
                else:
                    self._take(self.index[sock], sock, on_params)
            for s in sorted(s for s, keys in self._waiting.items() if keys):
                lost = self._lost.get(s)
                if lost is not None and now - lost[0] >= self.LOST_GRACE_S:
                    raise PSError(f"iteration {iteration}: {self.name(s)} {lost[1]}")

    def _take(self, s, sock, on_params):
        """One message from shard s, which must be a due PARAMS."""
        frames = sock.recv_multipart(copy=False)
        try:
            msg = P.decode(frames, self.config.max_frame_bytes,
                           placed=self.segments.placed if self.segments is not None else None)
        except ProtocolError as e:
            raise PSError(f"{self.name(s)} sent a malformed answer: {e}") from None
        if msg.op == Op.ABORT:
            raise PSError(f"{self.name(s)} aborted: {msg.text()}" + self._waiting_note(s))
        if msg.op == Op.ERROR:
            raise PSError(f"{self.name(s)} rejected rank {self.config.rank}'s message: "
                          f"{msg.text()}")
        due = self._waiting.get(s)
        if msg.op != Op.PARAMS or not due or (
                self._expect_iter is not None and msg.iteration != self._expect_iter):
            awaited = "the join" if self._expect_iter is None else self._expect_iter
            raise PSError(f"{self.name(s)}: unexpected {msg.op.name} for iteration "
                          f"{msg.iteration} while waiting for PARAMS of {awaited}")
        if self._got_iter is not None and msg.iteration != self._got_iter:
            raise PSError(f"{self.name(s)} is at iteration {msg.iteration}, other shards "
                          f"at {self._got_iter}: restart the servers from one snapshot iteration")
        self._got_iter = msg.iteration
        ids = tuple(p.blob_id for p in msg.payloads if p.blob_id >= 0)
        if ids not in due:
            expected = " or ".join(str(list(k)) for k in sorted(due))
            raise PSError(f"{self.name(s)} answered blobs {list(ids)}, expected {expected} "
                          "(servers listed in another order?)")
        due.discard(ids)
        for p in msg.payloads:
            if p.blob_id == P.SEGMENT_BLOB:
                self._attach(s, p.array)
        for p in msg.payloads:
            if p.blob_id >= 0:
                on_params(p.blob_id, p.array)
        self._pulled += P.frames_nbytes(frames)   # on the wire, headers included

    def _attach(self, s, text):
        """Shard s's answer to INIT names its parameter segment (--ps-shm)."""
        if self.segments is None:
            raise PSError(f"{self.name(s)} named a shared-memory segment; this worker did not "
                          "ask for one")
        try:
            self.segments.attach(s, bytes(text).decode("ascii"))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise PSError(f"{self.name(s)}: {e}") from None

    @property
    def _timeout(self) -> float:
        return self.config.timeout + self.config.grace

    def join(self, iteration, solver_bytes: bytes, values, specs, on_params) -> int:
        """Register with every shard; returns the iteration the servers are at.

        values[i], specs[i]: blob i's initial values (host array) and
        (lr_mult, decay_mult).
        """
        solver_pl = (-1, np.frombuffer(solver_bytes, dtype=np.uint8))

        def payloads(s):
            out = [solver_pl]
            if self.segments is not None:
                out.append((P.SEGMENT_BLOB,
                            np.frombuffer(self.segments.name(s).encode("ascii"), np.uint8)))
            if len(self.buckets[s]) > 1:   # one bucket (the whole shard) needs no table
                bucket = {i: b for b, ids in enumerate(self.buckets[s]) for i in ids}
                out.append((-2, np.array([bucket[i] for i in self.shards[s]], dtype=np.int64)))
            for i in self.shards[s]:
                out.append((i, values[i]))
                out.append((i, np.asarray(specs[i], dtype=np.float64)))
            return out

        self._expect([[tuple(ids)] for ids in self.shards], None)
        self._send(Op.INIT, iteration, ((s, payloads(s)) for s in range(len(self.socks))))
        self._receive(iteration, on_params, time.monotonic() + self._timeout)
        if self.segments is not None:
            missing = [s for s, seg in enumerate(self.segments.params) if seg is None]
            if missing:
                raise PSError(f"{self.name(missing[0])} answered without a shared-memory "
                              "segment (a server without --ps-shm support?)")
        return self._got_iter

    def _expect_round(self, iteration: int):
        if self._round != iteration:
            self._expect([[tuple(b) for b in bs] for bs in self.buckets], iteration + 1,
                         round_of=iteration)

    def push_pull(self, iteration: int, grads_of_shard, on_params) -> tuple:
        """PUSH(iteration) to every shard, then PARAMS(iteration + 1) from each.

        grads_of_shard(s) -> [(blob id, host array)] is called just before
        shard s's message is sent, so that preparing one shard's gradients
        (a device-to-host copy) overlaps the transfer of the previous one.
        Without overlap a shard is one bucket.  Returns (bytes pushed, bytes pulled).
        """
        self._expect_round(iteration)
        sent = self._send(Op.PUSH, iteration,
                          ((s, grads_of_shard(s)) for s in range(len(self.socks))))
        self._receive(iteration, on_params, time.monotonic() + self._timeout)
        return sent, self._pulled

    # Overlap: one bucket's push at a time, during backward; PARAMS taken as they come.
    def push(self, iteration: int, s: int, payloads) -> int:
        """PUSH(iteration) of one bucket of shard ``s`` (its gradients), without
        waiting: sent now (ZeroMQ's I/O thread moves the zero-copy frames), or with
        an emulated link queued until the link delivers it (:meth:`send_due`).
        Returns the bytes pushed."""
        self._expect_round(iteration)
        frames = P.encode(Op.PUSH, iteration, self.config.rank, s, payloads)
        nbytes = P.frames_nbytes(frames)
        if self.link.enabled:
            due = self.link.schedule([(("push", s), nbytes)])[0]
            self._due.append((due, s, frames))
        else:
            self._send_one(s, frames)
        return nbytes

    def send_due(self, wait: bool = False) -> int:
        """Send the queued emulated-link pushes whose time has come, earliest
        first; ``wait``: sleep until every one has gone.  Returns how many were sent."""
        self._due.sort(key=lambda x: x[0])
        sent = 0
        while self._due:
            rest = self.link.wait_time(self._due[0][0])
            if rest > 0:
                if not wait:
                    return sent
                self.link.sleep(rest)
            _, s, frames = self._due.pop(0)
            self._send_one(s, frames)
            sent += 1
        return sent

    def next_send_s(self):
        """Seconds until the next queued emulated-link push is due (<= 0: due now), or None
        when none is queued."""
        if not self._due:
            return None
        return self.link.wait_time(min(d[0] for d in self._due))

    def receive_ready(self, iteration: int, on_params):
        """The PARAMS(iteration + 1) buckets that have arrived already (never waits)."""
        if self._round == iteration:
            self._receive(iteration, on_params, None)

    def pull(self, iteration: int, on_params) -> int:
        """Once every bucket has been pushed: the PARAMS(iteration + 1) buckets not
        taken yet, from every shard; returns the bytes pulled in this round."""
        self._expect_round(iteration)
        self.send_due(wait=True)
        self._receive(iteration, on_params, time.monotonic() + self._timeout)
        return self._pulled

    def abort(self, iteration: int, reason: str):
        """Tell every shard this worker gives up (best effort, never raises)."""
        for s, sock in enumerate(self.socks):
            try:
                send(sock, P.encode_text(Op.ABORT, iteration, self.config.rank, s, reason),
                     flags=self._zmq.NOBLOCK)
            except Exception:
                pass

    def close(self):
        for s, m in zip(self.socks, self.monitors):
            s.disable_monitor()
            m.close(linger=0)
        for s in self.socks:
            s.close(linger=1000)   # lets a final ABORT leave
        self.socks = []
        self.monitors = []
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None


# -------------------------------------------------------------- data slices
class RankSlicer:
    """Worker ``rank`` keeps the ``rank``-th of every ``world_size`` batches of
    each data layer of the train net (layers with no bottoms but Input).

    Underlying batch ``c * W + r`` is the c-th batch worker r keeps, so the
    union of the workers' batches at iteration t is exactly the batch of W x k
    that one worker would read.  The count of batches kept so far follows
    from the solver's iteration, so a resumed worker (whose data layers
    restored their read positions) skips correctly too.
    """

    def __init__(self, solver, rank: int, world_size: int):
        self.solver = solver
        self.rank = rank
        self.world_size = world_size
        self.layers = []
        net = solver.net
        for li, layer in enumerate(net.layers):
            if not net.bottom_vecs[li] and layer.type != "Input":
                self._wrap(layer)
                self.layers.append(net.layer_names[li])

    def _wrap(self, layer):
        original = layer.forward
        state = {"first": True}

        def forward(bottom, top):
            if state["first"]:
                state["first"] = False
                kept = self.solver.iter * max(1, self.solver.param.iter_size)
                # A resumed layer that restored its read position stands just
                # after the last batch this rank kept; one that cannot restore
                # it starts from the beginning again (as in Caffe).
                restored = kept > 0 and _restores_position(layer)
                if kept > 0 and not restored:
                    log(f"layer {layer.name!r} ({layer.type}) cannot restore its read position: "
                        "the resumed run reads its data from the start", level="W",
                        where="ps.worker")
                skip = self.world_size - 1 if restored else self.rank
            else:
                skip = self.world_size - 1
            for _ in range(skip):
                original(bottom, top)
            return original(bottom, top)

        layer.forward = forward


# Layers whose only "position" is the host RNG, which a solver snapshot restores.
_RNG_FED = ("DummyData",)


def _restores_position(layer) -> bool:
    return layer.type in _RNG_FED or (hasattr(layer, "state_dict")
                                      and hasattr(layer, "load_state_dict"))


# ------------------------------------------------------------------- timing
@dataclass
class SyncRecord:
    iteration: int
    compute_s: float
    delta_s: float
    bytes_pushed: int
    bytes_pulled: int
    # where Delta went, when the worker says (the parameter server's, with overlap: push_s,
    # the pushes and copies left at the update; pull_wait_s, waiting for the answers still
    # out; copy_up_s, copying answers into the net, wherever the mode does it; early_mb,
    # answers back before the update; copy-up forward: fwd_wait_s, this iteration's forward
    # waiting for the copy thread, copy_thread_s, that thread's time; any GPU worker:
    # host_ahead_s, how long the update waited for backward's kernels, within compute)
    parts: dict = field(default_factory=dict)


class SyncStats:
    """Per-iteration compute time and synchronisation time (Delta)."""

    def __init__(self, path: str | None = None, keep: int = 100_000):
        self.path = path
        self.records: deque = deque(maxlen=keep)
        self._file = open(path, "a") if path else None
        self._since_display: deque = deque(maxlen=keep)   # bounded even without display

    def add(self, rec: SyncRecord):
        self.records.append(rec)
        self._since_display.append(rec)
        if self._file is not None:
            self._file.write(json.dumps(rec.__dict__) + "\n")

    def display_line(self) -> str:
        """Means since the previous display, and compute/communication."""
        recs = list(self._since_display) or list(self.records)[-1:]
        self._since_display.clear()
        if self._file is not None:
            self._file.flush()
        if not recs:
            return "no synchronisation yet"
        n = len(recs)
        comp = sum(r.compute_s for r in recs) / n
        delta = sum(r.delta_s for r in recs) / n
        pushed = sum(r.bytes_pushed for r in recs) / n
        pulled = sum(r.bytes_pulled for r in recs) / n
        ratio = comp / delta if delta > 0 else float("inf")
        return (f"Delta (sync) = {1e3 * delta:.4g} ms, compute = {1e3 * comp:.4g} ms, "
                f"computation/communication = {ratio:.3g} (mean of {n} iteration(s); "
                f"{pushed / 1e6:.3g} MB pushed, {pulled / 1e6:.3g} MB pulled per iteration)")

    def mean_delta(self) -> float:
        """Mean Delta (seconds) over the kept records: eq. (3)'s Delta for the tuner."""
        return sum(r.delta_s for r in self.records) / max(1, len(self.records))

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


# --------------------------------------------------------------- the worker
class _NoLocalHistory:
    """The solver's update rule on a worker: the history lives on the shards,
    so snapshots and restores of a worker hold none."""

    def state_blobs(self):
        return []

    def compute_update(self, i, q, local_rate):  # pragma: no cover - never called
        raise RuntimeError("a parameter-server worker does not update locally")


def _thread_usage():
    """The calling thread's (CPU seconds, voluntary, involuntary context switches), or None
    where the system has no per-thread usage (Linux has)."""
    try:
        import resource
        u = resource.getrusage(resource.RUSAGE_THREAD)
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return u.ru_utime + u.ru_stime, u.ru_nvcsw, u.ru_nivcsw


def _thread_cpu(thread) -> float | None:
    """CPU seconds ``thread`` (a running ``threading.Thread``) has used, from its own clock;
    None where it is not alive or the system has no per-thread clocks."""
    if thread is None or not thread.is_alive() or thread.ident is None:
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, ValueError):
        return None


def _usage_parts(before, after) -> dict:
    """The main thread's use during compute: host_cpu_s, the CPU time it ran (against the
    compute's wall time: the rest it waited, for the GPU, the GIL or another thread);
    host_vcsw and host_ivcsw, how often it blocked and how often the scheduler took its core."""
    if before is None or after is None:
        return {}
    return {"host_cpu_s": after[0] - before[0], "host_vcsw": after[1] - before[1],
            "host_ivcsw": after[2] - before[2]}


def _terminate(signum, frame):
    raise PSError(f"terminated by signal {signum}")


class DataParallel:
    """What every data-parallel worker shares: rank-aware snapshots and data,
    rank-0-only testing, timing statistics, and the take-over of the
    solver's ``apply_update`` by :meth:`_synchronize`.

    Args:
        solver: a built :class:`~minicaffe.solver.Solver` (weights loaded).
        rank, world_size: this worker's place.
        data_hook: ``hook(solver, rank, world_size)`` run before each
            iteration's forward passes (to feed Input layers).
        slice_data: apply :class:`RankSlicer` to the data layers.
    """

    where = "ps.worker"

    def __init__(self, solver, rank: int, world_size: int, data_hook=None, slice_data=True,
                 stats_path=None):
        self.solver = solver
        self.rank = rank
        self.world_size = world_size
        self.base_prefix = solver._prefix()
        p = solver.param
        if rank > 0:
            # Only rank 0 tests (Caffe's root solver); each rank snapshots its
            # own data positions, under its own name; rank 0's caffemodel is
            # the model, under the usual name.
            p.test_interval = 0
            p.snapshot_prefix = f"{self.base_prefix}_rank{rank}"
        self.slicer = (RankSlicer(solver, rank, world_size) if slice_data and world_size > 1
                       else None)
        if data_hook is not None:
            solver.callbacks.append(_DataHook(data_hook, rank, world_size))
        self.stats = SyncStats(stats_path)
        self._t_sync_end = None
        self._usage_end = _thread_usage()    # the main thread's CPU use at the last sync end
        self._helper_cpu: dict = {}          # column -> (thread ident, its CPU s) at that end
        self._on_gpu = any(is_gpu_array(q.data) for q in solver.net.learnable_params)
        self.overlap = None      # a GradientOverlap on the train net's backward, if on
        self._launches = 0       # the executor's graph launches at the last sync (_graph_parts)
        solver.apply_update = self._apply_update   # the take-over

    def _log(self, msg, level="I"):
        if self.solver.verbose or level != "I":
            log(msg, level=level, where=self.where)

    # Subclasses provide _join() (before the first iteration), _synchronize(display)
    # (returns bytes sent and received), _after_sync(display) (what follows the
    # synchronisation, outside Delta), _abort(reason) and _close().
    def _apply_update(self, display: bool = False):
        s = self.solver
        ahead = None
        usage = _thread_usage()    # before the wait for the GPU, which may spin
        if self._on_gpu:
            # Backward's kernels may still be queued: compute ends when they
            # do, so that Delta measures synchronisation only (a sync point).
            import cupy
            t = time.perf_counter()
            cupy.cuda.get_current_stream().synchronize()
            ahead = time.perf_counter() - t    # how far the host ran ahead of the GPU
        t0 = time.perf_counter()
        compute = t0 - self._t_sync_end if self._t_sync_end is not None else 0.0
        rate = s.get_learning_rate()       # keeps the multistep bookkeeping in step
        if display:
            s._log(f"Iteration {s.iter}, lr = {rate:.6g}")
        pushed, pulled = self._synchronize(display)
        t1 = time.perf_counter()
        parts = self._sync_parts()
        if ahead is not None:
            parts["host_ahead_s"] = ahead
            parts.update(self._backlog_parts())
        parts.update(self._graph_parts())
        parts.update(_usage_parts(self._usage_end, usage))
        parts.update(self._helper_usage())
        self.stats.add(SyncRecord(s.iter, compute, t1 - t0, pushed, pulled, parts))
        if display:
            self._log(f"Iteration {s.iter}, rank {self.rank}/{self.world_size}: "
                      + self.stats.display_line())
        # What follows the synchronisation (NCCL: the local update) is computation: it
        # counts in the next iteration's compute, so that compute + Delta is the period.
        self._sync_ended()
        self._after_sync(display)

    def _helper_usage(self) -> dict:
        """With ``--ps-stats``: the CPU seconds the worker's round thread (``round_cpu_s``) and
        forward copy thread (``copy_cpu_s``) ran since the previous synchronisation (Linux's
        per-thread CPU clocks; nothing where a thread is missing or new).  Beside the main
        thread's ``host_cpu_s`` they tell who holds the GIL while the main thread waits for
        it (``host_vcsw``)."""
        if self.stats.path is None:
            return {}
        threads = {"round_cpu_s": getattr(getattr(self, "_round", None), "_thread", None),
                   "copy_cpu_s": getattr(getattr(self, "_copy", None), "_thread", None)}
        last = self._helper_cpu
        out = {}
        for key, t in threads.items():
            now = _thread_cpu(t)
            if now is None:
                last.pop(key, None)
                continue
            before = last.get(key)
            if before is not None and before[0] == t.ident:
                out[key] = now - before[1]
            last[key] = (t.ident, now)
        return out

    def _graph_parts(self) -> dict:
        """``graph``: 1.0 when this iteration's passes were CUDA graph launches
        (swap.graph), 0.0 when they ran eagerly; nothing without a swap plan on the GPU."""
        ex = getattr(self.solver.net, "executor", None)
        if ex is None or not getattr(ex.streams, "gpu", False):
            return {}
        n = ex.graph_launches
        before, self._launches = self._launches, n
        return {"graph": 1.0 if n > before else 0.0}

    def _backlog_parts(self) -> dict:
        """With ``--ps-stats`` on the GPU under a swap plan: ``gpu_backlog_s`` and
        ``gpu_backlog_max_s`` of the iteration that just synchronized
        (:class:`swap.runtime.Backlog`, from the second iteration on), to tell a rank whose
        host fell behind (backlog near zero) from one whose device did (backlog up to the
        launch queue's depth)."""
        ex = getattr(self.solver.net, "executor", None)
        if self.stats.path is None or ex is None or not getattr(ex.streams, "gpu", False):
            return {}
        if ex.graph_captured:
            return {}           # a graph launch: the probes are not in it (swap.graph)
        from swap.runtime import Backlog, backlog_summary
        if ex.backlog is None:
            ex.backlog = Backlog(ex.streams, ex.gmap.n_steps)
            return {}
        return backlog_summary(ex.backlog.read())

    def _sync_ended(self):
        """The next iteration's compute starts now (its wall clock and the main thread's
        CPU use)."""
        self._t_sync_end = time.perf_counter()
        self._usage_end = _thread_usage()

    def _after_sync(self, display):
        """Nothing by default: the parameter server has updated the parameters."""

    def _sync_parts(self) -> dict:
        """The parts of this iteration's Delta the worker timed (none by default)."""
        return {}

    def _land(self):
        """The parameters of the last round are in the net for whatever reads them next
        (nothing to do by default: the round ends with them there)."""

    def solve(self, resume_file: str | None = None):
        """Caffe's Solver::Solve, data-parallel: restore, join, train, leave."""
        s = self.solver
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, whole_messages(_terminate)) if main else None
        try:
            if resume_file:
                s._log(f"Restoring previous solver status from {resume_file}")
                s.restore(resume_file)
            self._join()
            self._sync_ended()
            s.solve()
            self._land()
        except BaseException as e:
            self._abort(f"rank {self.rank}: {type(e).__name__}: {e}")
            raise
        finally:
            if main and old is not None:
                signal.signal(signal.SIGTERM, old)
            self.stats.close()
            self._close()

    def step(self, iters: int):
        """Solver.step, data-parallel (joins first when needed); for API use."""
        try:
            if self._t_sync_end is None:
                self._join()
                self._sync_ended()
            self.solver.step(iters)
            self._land()
        except BaseException as e:
            self._abort(f"rank {self.rank}: {type(e).__name__}: {e}")
            self._close()
            raise

    def close(self):
        self.stats.close()
        self._close()

    def _overlap_on(self, groups, on_ready, between_layers=None) -> GradientOverlap:
        """Listen to the train net's backward: ``on_ready(g, event)`` once group g's
        diffs are final (:mod:`ps.overlap`)."""
        self.overlap = GradientOverlap(self.solver.net, groups, self.solver.param.iter_size,
                                       on_ready, between_layers, gpu=self._on_gpu)
        return self.overlap

    def _overlap_off(self):
        if self.overlap is not None:
            self.overlap.detach()
            self.overlap = None


class _DataHook:
    def __init__(self, hook, rank, world_size):
        self.hook, self.rank, self.world_size = hook, rank, world_size

    def on_start(self, solver):
        self.hook(solver, self.rank, self.world_size)


class PSWorker(DataParallel):
    """A worker of the ZeroMQ parameter server (``--comm ps``)."""

    def __init__(self, solver, config: PSConfig, data_hook=None, slice_data=True):
        config.validate()
        p = solver.param
        S = len(config.endpoints)
        if S > 1 and p.HasField("clip_gradients") and p.clip_gradients >= 0:
            raise ValueError("clip_gradients needs the norm over all parameters, which no shard "
                             "sees alone: use one server shard, or drop clip_gradients")
        super().__init__(solver, config.rank, config.world_size, data_hook, slice_data,
                         config.stats_path)
        self.config = config
        self.params = solver.net.learnable_params
        nbytes = [q.nbytes for q in self.params]
        if config.overlap:
            mb = DEFAULT_PS_BUCKET_MB if config.bucket_mb is None else config.bucket_mb
            cap = bucket_cap(nbytes, S, max(1, int(mb * (1 << 20))))
            if p.HasField("clip_gradients") and p.clip_gradients >= 0:
                cap = max(1, sum(nbytes))   # (one shard) clipping needs every gradient at once
            tail_mb = DEFAULT_PS_TAIL_MB if config.tail_mb is None else config.tail_mb
            tail = int(tail_mb * (1 << 20))
            buckets = make_buckets(nbytes, backward_order(solver.net), cap, tail,
                                   min(cap, int(PS_TAIL_BUCKET_MB * (1 << 20))))
            home = assign_buckets([sum(nbytes[i] for i in b) for b in buckets], S)
            for s in sorted(set(range(S)) - set(home)):   # an empty shard: an empty bucket
                buckets.append([])
                home.append(s)
            # (shard, blob ids) per bucket, in the order backward finishes them
            self.buckets = list(zip(home, buckets))
            self.shards = [sorted(i for h, b in self.buckets if h == s for i in b)
                           for s in range(S)]
        else:
            self.shards = assign_shards(nbytes, S)
            self.buckets = list(enumerate(self.shards))
        # The history lives on the shards: free the solver's copy.
        solver.rule = _NoLocalHistory()
        solver.history = []
        self._segments = None
        if config.shm:
            self._segments = WorkerSegments(
                config.rank, self.shards, [q.shape for q in self.params],
                self.params[0].data.dtype if self.params else np.float32,
                gpu=self._on_gpu)
        # where gradients go on the host (GPU: pinned buffers; --ps-shm: the segments)
        self._staging = (self._make_staging()
                         if self._on_gpu or self._segments is not None else None)
        self._wrap = P.InShm if self._segments is not None else (lambda a: a)
        self.client = None
        self._copy_up_s = 0.0     # this iteration's time in _set_param
        self._parts: dict = {}    # this iteration's parts of Delta (_sync_parts)
        # with overlap, when answers go into the net (ps.copyup)
        # a CUDA graph of the iteration (swap.graph) cannot wait per layer in forward: the
        # answers go up at the update unless --copy-up says otherwise (the graph then refuses)
        self._graphed = self._on_gpu and bool(getattr(solver, "cuda_graph", False)) and (
            getattr(solver.net, "executor", None) is not None)
        self.copy_mode = (copy_up_mode(self._on_gpu, config.copy_up
                                       or ("update" if self._graphed else None))
                          if config.overlap else None)
        self._capturing = False   # a capture of the iteration is running (_GraphHook)
        self._captured = []       # buckets whose copies the captured iteration issues
        self._copy = None         # forward: the copy thread
        self._held = []           # update: (blob id, array) taken during backward
        self._early = 0           # bytes of answers taken during backward, this iteration
        self._fwd_wait_s = 0.0    # forward: the host's wait for the copy thread, this iteration
        self._copy_busy = 0.0     # forward: the copy thread's time until the last record
        if config.overlap:
            self._round = None       # the RoundThread, from the join on
            if self._on_gpu:
                import cupy
                # backward's copies down, issued without letting go of the GIL (DriverCopies)
                self._driver = driver_copies()
                self._copy_stream = cupy.cuda.Stream(non_blocking=True)
                # the round thread sleeps on these (blocking sync), it does not spin
                self._copy_done = [cupy.cuda.Event(block=True, disable_timing=True)
                                   for _ in self.buckets]
                self._copy_joined = cupy.cuda.Event(disable_timing=True)
                if self._graphed:
                    solver.net.executor.graph_hooks.append(_GraphHook(self))
            self._overlap_on([b for _, b in self.buckets], self._bucket_ready)
            if self.copy_mode == "forward":
                self._forward_copy_on(solver)
        if self._on_gpu:
            import cupy
            # new parameters go up on their own stream; the compute stream waits for them
            # at the end of the round (:meth:`_params_landed`)
            self._param_stream = cupy.cuda.Stream(non_blocking=True)
            self._param_done = cupy.cuda.Event(disable_timing=True)
        loads = shard_bytes(nbytes, self.shards)
        self._log(f"rank {config.rank} of {config.world_size}; {S} shard(s): "
                  + ", ".join(f"{ep} holds {len(ids)} blob(s), {b:,} bytes"
                              for ep, ids, b in zip(config.endpoints, self.shards, loads))
                  + (f"; overlap: {len(self.buckets)} bucket(s) of at most {cap:,} bytes in "
                     "backward order, each pushed once backward has finished it; answers "
                     f"copied into the net: {self.copy_mode}"
                     if config.overlap else "; overlap off")
                  + (f"; data layers sliced by rank: {', '.join(self.slicer.layers)}"
                     if self.slicer and self.slicer.layers else ""))

    def _forward_copy_on(self, solver):
        """Copy-up ``forward`` (ps.copyup): a copy thread, and the train net's forward
        waits per layer for its buckets; whatever else reads the parameters lands them all
        first."""
        net = solver.net
        if net.forward_listener is not None:
            raise RuntimeError(f"net {net.name!r} already has a forward listener")
        groups = [b for _, b in self.buckets]
        self._needs = forward_needs(net, groups)
        # the last layer of a forward waits for whatever is left (a partial pass's buckets)
        last = len(net.layers) - 1
        self._needs[last] = list(range(len(groups)))
        order = [b for li in sorted(self._needs) if li != last for b in self._needs[li]]
        self._copy = CopyUp(self.params, groups, order, self._staging, self.config.timeout,
                            gpu=self._on_gpu, direct=self._segments is not None)
        net.forward_listener = self._forward_wait
        for name in ("test_all", "snapshot"):
            setattr(solver, name, self._landing(getattr(solver, name)))

    def _landing(self, fn):
        def landed(*args, **kwargs):
            self._land()
            return fn(*args, **kwargs)
        return landed

    def _forward_wait(self, li):
        buckets = self._needs.get(li)
        if buckets:
            t0 = time.perf_counter()
            try:
                self._copy.wait(buckets)
            except CopyError as e:
                raise PSError(f"iteration {self.solver.iter}, layer "
                              f"{self.solver.net.layer_names[li]!r}: {e}") from None
            self._fwd_wait_s += time.perf_counter() - t0

    def _land(self, settle: bool = False):
        """Copy-up forward: every copy of the last round is waited for by the current
        stream (``settle``: and its staging buffers are free again)."""
        if self._copy is not None:
            try:
                self._copy.settle() if settle else self._copy.land()
            except CopyError as e:
                raise PSError(f"iteration {self.solver.iter}: {e}") from None

    def _take_early(self, i, array):
        """An answer taken during backward, per the copy-up mode."""
        self._early += array.nbytes
        self._take_late(i, array)

    def _take_late(self, i, array):
        """An answer taken at the update, per the copy-up mode."""
        if self.copy_mode == "forward":
            self._copy.arrived(i, array)
        elif self.copy_mode == "update":
            self._held.append((i, array))
        else:
            self._set_param(i, array)

    def _make_staging(self):
        """Host buffers for the gradients: the shared-memory segments' places (--ps-shm),
        else pinned buffers (device-to-host copies)."""
        if self._segments is not None:
            return [self._segments.grad(i) for i in range(len(self.params))]
        try:
            import cupyx
            return [cupyx.empty_pinned(q.shape, dtype=q.dtype) for q in self.params]
        except Exception:  # pragma: no cover - pinned memory unavailable
            return [np.empty(q.shape, dtype=q.dtype) for q in self.params]

    def _host_grad(self, i):
        q = self.params[i]
        if self._staging is None:
            return np.ascontiguousarray(q.diff)     # CPU mode: the diff itself, no copy
        if self._on_gpu:
            q.diff.get(out=self._staging[i])         # device -> host; synchronises
        else:                                        # CPU, --ps-shm: into the segment
            np.copyto(self._staging[i], q.diff.reshape(self._staging[i].shape))
        return self._staging[i]

    def _set_param(self, i, array):
        """Blob i's new values.  During backward (overlap) only blobs whose backward is over
        arrive: a bucket comes back after this worker pushed it, which was after the
        layers that read the blobs had run (GPU: after the copy that waited on their
        event)."""
        t0 = time.perf_counter()
        q = self.params[i]
        if self._on_gpu:   # host -> device on the parameter stream
            q.data.set(np.ascontiguousarray(array).reshape(q.shape), stream=self._param_stream)
        else:
            np.copyto(q.data, array.reshape(q.shape))
        self._copy_up_s += time.perf_counter() - t0

    def _params_landed(self):
        """The compute stream waits for the parameters set so far (GPU)."""
        if self._on_gpu:
            import cupy
            self._param_done.record(self._param_stream)
            cupy.cuda.get_current_stream().wait_event(self._param_done)

    def _join(self):
        c = self.config
        s = self.solver
        per_shard = [[] for _ in self.shards]
        for h, b in self.buckets:
            per_shard[h].append(sorted(b))
        self.client = ParameterClient(c, self.shards, per_shard, self._segments)
        sp = caffe_pb2.SolverParameter()
        sp.CopyFrom(s.param)
        for f in ("net_param", "train_net_param", "test_net_param"):
            sp.ClearField(f)   # the servers need the update fields, not the nets
        sp.snapshot_prefix = self.base_prefix
        values = [np.ascontiguousarray(to_numpy(q.data)) for q in self.params]
        specs = list(zip(s.net.param_lr_mult, s.net.param_decay_mult))
        t0 = time.perf_counter()
        at = self.client.join(s.iter, sp.SerializeToString(), values, specs, self._set_param)
        self._params_landed()
        if at != s.iter:  # the servers check this; a mismatch here is a server bug
            raise PSError(f"the servers are at iteration {at}, this worker at {s.iter}")
        self._copy_up_s = 0.0    # the join's copies are not an iteration's
        if self._segments is not None:   # every shard has mapped this worker's segments
            self._segments.unlink()
        if self.overlap is not None:   # the client is the round thread's from now on
            device = None
            if self._on_gpu:
                import cupy
                device = cupy.cuda.Device()
            self._round = RoundThread(self.client, [h for h, _ in self.buckets],
                                      self._bucket_payloads, self._take_early,
                                      self._take_late, device)
        self._log(f"joined {len(c.endpoints)} shard(s) at iteration {at} in "
                  f"{time.perf_counter() - t0:.3g} s")

    def _synchronize(self, display):
        s = self.solver
        if self.overlap is None:
            out = self.client.push_pull(
                s.iter, lambda sh: [(i, self._wrap(self._host_grad(i))) for i in self.shards[sh]],
                self._set_param)
            self._params_landed()
            return out
        self.overlap.flush()              # buckets backward did not finish (none, normally)
        pushed, pulled, self._parts = self._round.finish(s.iter)
        held, self._held = self._held, []
        for i, array in held:             # copy-up "update"
            self._set_param(i, array)
        if self._copy is not None:
            self._copy.go()               # up during the next forward, layer by layer
        else:
            self._params_landed()
        self._parts["early_mb"] = self._early / 1e6
        self._early = 0
        self.overlap.reset()
        return pushed, pulled

    def _sync_parts(self) -> dict:
        parts, self._parts = dict(self._parts, copy_up_s=self._copy_up_s), {}
        if self._copy is not None:
            parts["fwd_wait_s"] = self._fwd_wait_s
            busy = self._copy.host_s + self._copy.issue_s
            parts["copy_thread_s"], self._copy_busy = busy - self._copy_busy, busy
        self._copy_up_s = self._fwd_wait_s = 0.0
        return parts

    # ------------------------------------------------------------ overlap
    def _bucket_ready(self, g, event):
        """Every gradient of bucket ``g`` is final (called in backward, or by the
        update's flush).  GPU: the copy stream waits on ``event`` (recorded on
        the compute stream after the kernels that wrote them) and copies the
        diffs to the pinned staging buffers; nothing waits on the host.  The round
        thread pushes the bucket once the copy is done."""
        # the last round's copies must be over before its staging buffers take gradients
        # again (they are, when the forward waited for every bucket)
        self._land(settle=True)
        done = None
        if self._on_gpu:
            side = self._copy_stream
            side.wait_event(event)
            for i in self.buckets[g][1]:
                diff = self.params[i].diff
                if self._driver is None or not self._driver.down(self._staging[i], diff,
                                                                   side.ptr):
                    diff.get(stream=side, out=self._staging[i], blocking=False)
            done = self._copy_done[g]
            if self._capturing:   # every launch records it; the round thread waits on it
                from swap.graph import record_external
                record_external(done, side)
                self._captured.append(g)
                return
            done.record(side)
        self._round.bucket(self.solver.iter, g, done)

    def _bucket_payloads(self, g, done):
        """(blob id, host array) of bucket g, its copy done (round thread)."""
        return [(i, self._wrap(self._host_grad(i) if done is None else self._staging[i]))
                for i in sorted(self.buckets[g][1])]

    def _stop_round(self):
        if self.overlap is not None and self._round is not None:
            if not self._round.stop():
                log("the round thread is still waiting; closing anyway", level="W",
                    where=self.where)
            self._round = None

    def _abort(self, reason):
        self._stop_round()
        if self.client is not None:
            self.client.abort(self.solver.iter, reason)

    def _close(self):
        self._stop_round()
        self._overlap_off()
        if self._copy is not None:
            if self.solver.net.forward_listener == self._forward_wait:
                self.solver.net.forward_listener = None
            self._copy.close()
            self._copy = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._segments is not None:
            if self._on_gpu:   # no copy may still read or write a mapping
                import cupy
                cupy.cuda.Device().synchronize()
            self._staging = None
            self._segments.close()
            self._segments = None


class _GraphHook:
    """A PS worker's part in its executor's CUDA graph (:mod:`swap.graph`).  During the
    capture the backward listener runs once: each bucket's device-to-host copies are captured
    on the copy stream after the compute event of its last layer, with an external record of
    its done event, and the bucket is kept back from the round thread.  After every launch the
    kept buckets go to the round thread in backward order, as an eager backward hands them,
    and the round thread waits on their done events as usual."""

    handles_backward_listener = True

    def __init__(self, worker):
        self.w = worker

    def capturing(self):
        self.w._capturing = True
        self.w._captured = []

    def captured(self, stream):
        w = self.w
        w._copy_joined.record(w._copy_stream)   # the copy stream joins the graph's end
        stream.wait_event(w._copy_joined)

    def capture_ended(self, ok: bool):
        w = self.w
        w._capturing = False
        if not ok:                # the iteration reruns eagerly: its listener issues them
            w._captured = []
            if w.overlap is not None:
                w.overlap.reset()

    def launched(self):
        w = self.w
        for g in w._captured:
            w.overlap.issued[g] = True
            w._round.bucket(w.solver.iter, g, w._copy_done[g])
