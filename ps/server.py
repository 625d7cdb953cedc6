"""A parameter-server shard: bulk-synchronous (BSP) rounds over a ROUTER socket.

Life of a shard::

    join     every rank sends INIT (its solver, the shard's blobs, their
             ParamSpec multipliers, which blobs form each bucket); the shard
             checks that all ranks agree, takes rank 0's initial values (or
             its own restored snapshot) and answers PARAMS(iteration) to
             everybody
    round t  every rank sends one PUSH(t) per bucket with its gradients.  As
             soon as every rank has pushed a bucket, its gradients are summed
             in rank order (so the result does not depend on arrival order),
             scaled by 1/W (Caffe's multi-GPU rule), the solver update runs on
             the bucket's blobs (:class:`ps.update.ShardSolver`, bit for bit
             the whole-shard update) and PARAMS(t+1) of that bucket goes back
             to every rank, while the other buckets are still arriving.  Once
             every bucket is done, a snapshot is written when due.
    done     after max_iter the shard writes its final snapshot and exits 0

Buckets pipeline the round: a shard's receiving, updating and answering
overlap, and a worker that pushes buckets during its backward pass (overlap,
ps/worker.py) gets the first new parameters back while backward goes on.  A
worker without overlap declares one bucket, the whole shard.

Failure rules (nothing waits forever):

* a round that has not heard from every rank ``timeout`` seconds after it
  began fails, naming the missing ranks; so does a join;
* an ABORT from a worker (it crashed, or lost another shard) fails the round;
* on failure the shard tells every other rank why (ABORT) and exits 1;
* a malformed, oversized or unexpected message is rejected with a logged
  reason and an ERROR answer to its sender; the shard carries on.

With ``--ps-shm`` workers (ps/shm.py) every INIT names the worker's gradient segment for
this shard; the shard then keeps its parameters in a segment of its own, which its
answer to INIT names, and the rounds' PUSH and PARAMS carry headers only.  All ranks use
shared memory or none does.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import zmq

from minicaffe.log import log
from minicaffe.proto import caffe_pb2

from . import protocol as P
from .protocol import Op, ProtocolError
from .shm import Segment, check_name
from .transport import (CurveServer, LinkModel, SendFailed, context, poll_until, router, send,
                        whole_messages)
from .update import ShardSolver, read_shard_state, update_fields


class RoundFailed(RuntimeError):
    """The BSP round (or the join) cannot complete; ``str()`` says why."""


class _Terminated(BaseException):
    """SIGTERM/SIGINT arrived (raised in the main thread by the handler)."""


@dataclass
class ServerConfig:
    """Settings of one shard (``minicaffe ps server`` options).

    bind: ZeroMQ endpoint to bind; ``tcp://127.0.0.1:*`` picks a free port.
    shard: this shard's index (workers list shards in ``--ps`` order).
    world_size: number of workers W; a round waits for all of them.
    timeout: seconds a join or a round may wait for the slowest worker;
        must exceed one iteration's compute, a test pass and a snapshot.
    restore: a shard snapshot (``..._shard{s}_iter_N.solverstate``) to resume.
    snapshot_prefix: overrides the workers' ``snapshot_prefix`` (the shard
        appends ``_shard{s}``).
    endpoint_file: where to write the bound endpoint (for launchers and
        tests that bind port 0).
    stats_path: append each round's :class:`_RoundStats` here as a JSON line.
    """

    bind: str = "tcp://127.0.0.1:*"
    shard: int = 0
    world_size: int = 1
    timeout: float = 120.0
    max_frame_bytes: int = P.DEFAULT_MAX_FRAME_BYTES
    restore: str | None = None
    snapshot_prefix: str | None = None
    endpoint_file: str | None = None
    curve_dir: str | None = None
    link_gbps: float | None = None
    link_latency_ms: float = 0.0
    stats_path: str | None = None
    verbose: bool = True


@dataclass
class _Join:
    """What one rank's INIT said."""

    routing_id: bytes
    iteration: int
    solver: object
    blob_ids: list
    arrays: list        # initial values (views of the received frames)
    lr_mult: list
    decay_mult: list
    buckets: list       # the bucket of each blob (INIT order); all 0: one bucket
    segment: str | None = None   # --ps-shm: the name of the worker's gradient segment


@dataclass
class _RoundStats:
    iteration: int = -1
    round_s: float = 0.0       # from the end of the previous round (or the join) to the end
    wait_s: float = 0.0        # from the round's start to the last gradient
    update_s: float = 0.0      # summing and updating, over the buckets
    send_s: float = 0.0        # handing the answers to ZeroMQ, over the buckets
    last_rank: int = -1        # the rank everybody waited for
    tail_s: float = 0.0        # from the last gradient's arrival to the last answer sent
    spread_s: float = 0.0      # the most any bucket waited from its first rank to its last
    rank_done_s: list = field(default_factory=list)   # per rank: its last push, from the start
    start_t: float = 0.0       # the round's start, time.monotonic() (one clock on one host)
    bytes_in: int = 0
    bytes_out: int = 0


class ShardServer:
    """One shard of the parameter server; :meth:`run` returns an exit status."""

    def __init__(self, config: ServerConfig):
        c = config
        if c.world_size < 1:
            raise ValueError(f"world size must be >= 1, got {c.world_size}")
        if c.shard < 0:
            raise ValueError(f"shard index must be >= 0, got {c.shard}")
        if c.timeout <= 0:
            raise ValueError(f"timeout must be positive, got {c.timeout}")
        self.config = c
        self.where = f"ps.shard{c.shard}"
        self.link = LinkModel(c.link_gbps, c.link_latency_ms)
        self.restored = None
        if c.restore:  # read now: a bad path fails before anybody waits on us
            self.restored = read_shard_state(c.restore)
            meta = self.restored[1]
            if meta.get("shard") != c.shard:
                raise ValueError(f"{c.restore}: snapshot of shard {meta.get('shard')}, this is "
                                 f"shard {c.shard}")
        self.solver: ShardSolver | None = None
        self.blob_ids: list[int] = []
        self.buckets: list[list[int]] = [[]]    # positions in blob_ids, per bucket
        self._bucket_of: dict = {}              # blob ids of a bucket (tuple) -> bucket
        self.routes: dict[int, bytes] = {}      # rank -> routing id
        self.endpoint = None
        self.prefix = None
        self._ctx = None
        self._sock = None
        self._curve = None
        # --ps-shm: the shard's parameter segment and each rank's gradient segment
        self._params_seg: Segment | None = None
        self._grad_segs: dict[int, Segment] = {}
        self._position: dict[int, int] = {}     # blob id -> position in blob_ids

    # ----------------------------------------------------------- plumbing
    def _log(self, msg, level="I"):
        if self.config.verbose or level != "I":
            log(msg, level=level, where=self.where)

    def open(self) -> str:
        """Bind the socket (and start CURVE); returns the bound endpoint."""
        c = self.config
        self._ctx = context(c.world_size)
        if c.curve_dir:
            self._curve = CurveServer(self._ctx, c.curve_dir, where=self.where)
        self._sock, self.endpoint = router(self._ctx, c.bind, max_frame_bytes=c.max_frame_bytes,
                                           send_timeout_s=c.timeout, curve=self._curve)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._log(f"shard {c.shard} listening on {self.endpoint} for {c.world_size} worker(s)"
                  + (" (CURVE)" if c.curve_dir else "")
                  + (f", link {c.link_gbps or 'inf'} Gb/s + {c.link_latency_ms} ms"
                     if self.link.enabled else ""))
        if c.endpoint_file:
            tmp = c.endpoint_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(self.endpoint + "\n")
            os.replace(tmp, c.endpoint_file)  # readers never see half a line
        return self.endpoint

    def close(self):
        if self.solver is not None:
            self.solver.close()
        for seg in [self._params_seg, *self._grad_segs.values()]:
            if seg is not None:
                seg.close()
        self._params_seg = None
        self._grad_segs = {}
        if self._sock is not None:
            self._sock.close()   # lingers up to `timeout` so the last replies leave
            self._sock = None
        if self._curve is not None:
            self._curve.stop()
            self._curve = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _reject(self, rid: bytes, reason: str, msg=None):
        """Log why a message was refused and tell its sender (best effort)."""
        who = f"rank {msg.rank}" if msg is not None else "peer"
        self._log(f"rejected a message from {who} [{rid.hex()}]: {reason}", level="W")
        frames = P.encode_text(Op.ERROR, msg.iteration if msg else -1, msg.rank if msg else -1,
                               self.config.shard, reason)
        try:
            send(self._sock, frames, rid)
        except zmq.ZMQError:
            pass  # the sender is gone; the log line is what matters

    def _next(self, deadline: float):
        """The next valid message before ``deadline``: (routing id, Message), or None.

        Malformed messages are rejected here; an ABORT ends the round.
        """
        c = self.config
        while True:
            if not poll_until(self._poller, deadline):
                if time.monotonic() >= deadline:
                    return None
                continue
            frames = self._sock.recv_multipart(copy=False)
            rid = frames[0].bytes
            try:
                msg = P.decode(frames[1:], c.max_frame_bytes,
                               placed=self._placed if self._grad_segs else None)
            except ProtocolError as e:
                self._reject(rid, str(e))
                continue
            if not 0 <= msg.rank < c.world_size:
                self._reject(rid, f"rank {msg.rank} out of range for world size "
                                  f"{c.world_size}", msg)
                continue
            if msg.shard != c.shard:
                self._reject(rid, f"message for shard {msg.shard} reached shard {c.shard} "
                                  f"({self.endpoint}): list the --ps endpoints in shard order", msg)
                continue
            known = self.routes.get(msg.rank)
            if known is not None and known != rid:
                self._reject(rid, f"rank {msg.rank} already joined from another connection", msg)
                continue
            if msg.op == Op.ABORT:
                raise RoundFailed(f"rank {msg.rank} aborted: {msg.text()}")
            return rid, msg

    def _send_all(self, op, iteration, make_payloads):
        """Send one message to every rank through the emulated links."""
        sends = []
        for rank, rid in sorted(self.routes.items()):
            frames = P.encode(op, iteration, rank, self.config.shard, make_payloads(rank))
            sends.append((("reply", rank), self._sock, frames, rid))
        try:
            self.link.send_all(sends)
        except SendFailed as e:
            ranks = _ranks(rank for _, rank in e.keys)
            raise RoundFailed(f"iteration {iteration}: cannot answer rank(s) {ranks}: "
                              f"{e.failures[0][1]} (the worker has gone)") from None
        return sum(P.frames_nbytes(f) for _, _, f, _ in sends)

    def _placed(self, rank, shard, blob_id, dtype, shape):
        """A ``FLAG_SHM`` payload of ``rank``: its blob in the rank's gradient segment."""
        seg = self._grad_segs.get(rank)
        if seg is None:
            raise ProtocolError(f"rank {rank} sent a shared-memory payload, but joined "
                                "without a segment")
        k = self._position.get(blob_id)
        if k is None:
            raise ProtocolError(f"blob {blob_id} is not on shard {self.config.shard}")
        a = seg.arrays[k]
        if a.dtype != dtype or a.shape != tuple(shape):
            raise ProtocolError(f"blob {blob_id}: the header says {dtype}{list(shape)}, the "
                                f"segment holds {a.dtype}{list(a.shape)}")
        return a

    def abort_all(self, reason: str):
        """Tell every joined rank that the round failed (best effort, no raise)."""
        for rank, rid in sorted(self.routes.items()):
            try:
                send(self._sock, P.encode_text(Op.ABORT, -1, rank, self.config.shard, reason), rid)
            except zmq.ZMQError:
                pass

    # --------------------------------------------------------------- join
    def _parse_init(self, rid, msg) -> _Join:
        """Check the shape of an INIT message (ProtocolError names the problem)."""
        pl = msg.payloads
        if not pl or pl[0].blob_id != -1 or pl[0].array.dtype != np.uint8:
            raise ProtocolError("INIT must start with the solver parameters (blob -1, uint8)")
        try:
            solver = caffe_pb2.SolverParameter.FromString(bytes(pl[0].array))
        except Exception as e:  # protobuf's DecodeError
            raise ProtocolError(f"INIT solver parameters do not parse: {e}") from None
        rest = pl[1:]
        segment = None
        if rest and rest[0].blob_id == P.SEGMENT_BLOB:    # --ps-shm
            if rest[0].array.dtype != np.uint8:
                raise ProtocolError("INIT: the segment name (blob -3) must be uint8 text")
            try:
                segment = check_name(bytes(rest[0].array).decode("ascii"))
            except (UnicodeDecodeError, ValueError) as e:
                raise ProtocolError(f"INIT: {e}") from None
            rest = rest[1:]
        table = None
        if rest and rest[0].blob_id == -2:
            table, rest = rest[0].array, rest[1:]
            if table.dtype != np.int64 or table.ndim != 1 or table.size != len(rest) // 2:
                raise ProtocolError(f"INIT: the bucket table (blob -2) must be int64 with one "
                                    f"entry per blob ({len(rest) // 2}), got {table.dtype}"
                                    f"{list(table.shape)}")
            used = sorted(set(table.tolist()))
            if used != list(range(len(used))):
                raise ProtocolError(f"INIT: buckets {used} must be numbered 0..B-1")
        if len(rest) % 2:
            raise ProtocolError("INIT blobs come as (values, [lr_mult, decay_mult]) pairs")
        ids, arrays, lr, decay = [], [], [], []
        for values, spec in zip(rest[0::2], rest[1::2]):
            if values.blob_id != spec.blob_id or values.blob_id < 0:
                raise ProtocolError(f"INIT: blob ids {values.blob_id} and {spec.blob_id} should "
                                    "name the same parameter")
            if spec.array.dtype != np.float64 or spec.array.shape != (2,):
                raise ProtocolError(f"INIT: blob {values.blob_id}: multipliers must be float64 "
                                    "[lr_mult, decay_mult]")
            if values.array.dtype.kind != "f":
                raise ProtocolError(f"INIT: blob {values.blob_id}: parameters must be floating "
                                    f"point, got {values.array.dtype}")
            ids.append(int(values.blob_id))
            arrays.append(values.array)
            lr.append(float(spec.array[0]))
            decay.append(float(spec.array[1]))
        if len(set(ids)) != len(ids) or ids != sorted(ids):
            raise ProtocolError(f"INIT: blob ids {ids} must be distinct and increasing")
        if len({a.dtype for a in arrays}) > 1:
            raise ProtocolError("INIT: the blobs of one shard must share one dtype")
        buckets = [0] * len(ids) if table is None else [int(b) for b in table]
        return _Join(rid, msg.iteration, solver, ids, arrays, lr, decay, buckets, segment)

    def join(self):
        """Wait for every rank's INIT, build the shard, answer PARAMS."""
        c = self.config
        deadline = time.monotonic() + c.timeout
        joined: dict[int, _Join] = {}
        while len(joined) < c.world_size:
            got = self._next(deadline)
            if got is None:
                missing = sorted(set(range(c.world_size)) - set(joined))
                raise RoundFailed(
                    f"rank(s) {_ranks(missing)} did not join within {c.timeout:g} s "
                    f"(joined: {_ranks(sorted(joined)) or 'none'})")
            rid, msg = got
            if msg.op != Op.INIT:
                self._reject(rid, f"{msg.op.name} before every rank has joined (expected "
                                  "INIT)", msg)
                continue
            if msg.rank in joined:
                self._reject(rid, f"rank {msg.rank} sent INIT twice", msg)
                continue
            try:
                j = self._parse_init(rid, msg)
            except ProtocolError as e:
                self._reject(rid, str(e), msg)
                continue
            joined[msg.rank] = j
            self.routes[msg.rank] = rid
            self._log(f"rank {msg.rank} joined [{rid.hex()}] at iteration {msg.iteration} with "
                      f"{len(j.blob_ids)} blob(s) ({sum(a.nbytes for a in j.arrays):,} bytes)")
        self._build(joined)
        nbytes = self._send_all(Op.PARAMS, self.solver.iter, self._join_payloads)
        self._log(f"all {c.world_size} rank(s) joined; serving blobs {self.blob_ids} "
                  f"({nbytes // max(1, c.world_size):,} bytes per worker) from iteration "
                  f"{self.solver.iter}")

    def _build(self, joined: dict):
        """Check that the ranks agree, then create the shard's solver."""
        c = self.config
        first = joined[0]
        ref_fields = update_fields(first.solver)
        for rank in range(1, c.world_size):
            j = joined[rank]
            if j.blob_ids != first.blob_ids:
                raise RoundFailed(f"rank {rank} registers blobs {j.blob_ids} with shard {c.shard}, "
                                  f"rank 0 blobs {first.blob_ids}: the workers' nets differ "
                                  "(or their overlap settings: --no-overlap places blobs on "
                                  "shards differently)")
            for k, (a, b) in enumerate(zip(j.arrays, first.arrays)):
                if a.shape != b.shape or a.dtype != b.dtype:
                    raise RoundFailed(
                        f"rank {rank}: blob {j.blob_ids[k]} is {a.dtype}{list(a.shape)}, rank 0's "
                        f"is {b.dtype}{list(b.shape)}: the workers' nets differ")
            if (j.lr_mult, j.decay_mult) != (first.lr_mult, first.decay_mult):
                raise RoundFailed(f"rank {rank}: lr_mult/decay_mult differ from rank 0's")
            if j.buckets != first.buckets:
                raise RoundFailed(f"rank {rank} groups blobs {j.blob_ids} into buckets "
                                  f"{j.buckets}, rank 0 into {first.buckets}: the workers' "
                                  "--bucket-mb (or overlap settings) differ")
            fields = update_fields(j.solver)
            diff = [f for f in ref_fields if fields.get(f) != ref_fields[f]]
            if diff:
                f = diff[0]
                raise RoundFailed(f"rank {rank}'s solver differs from rank 0's in "
                                  f"{', '.join(diff)} ({f}: {fields.get(f)!r} vs "
                                  f"{ref_fields[f]!r})")
            if j.iteration != first.iteration:
                raise RoundFailed(f"rank {rank} starts at iteration {j.iteration}, rank 0 at "
                                  f"{first.iteration}: restart every worker from the same snapshot")
        self.blob_ids = list(first.blob_ids)
        nb = max(first.buckets, default=0) + 1
        self.buckets = [[k for k, b in enumerate(first.buckets) if b == i] for i in range(nb)]
        self._bucket_of = {tuple(self.blob_ids[k] for k in pos) or (-1,): i
                           for i, pos in enumerate(self.buckets)}
        p = first.solver
        if nb > 1 and p.HasField("clip_gradients") and p.clip_gradients >= 0:
            raise RoundFailed("clip_gradients needs every gradient of the shard at once; the "
                              f"workers send shard {c.shard} in {nb} buckets (use one server "
                              "shard with --no-overlap, or drop clip_gradients)")
        dtype = first.arrays[0].dtype if first.arrays else np.dtype(np.float32)
        shapes = [a.shape for a in first.arrays]
        data = self._open_segments(joined, shapes, dtype)
        try:
            self.solver = ShardSolver(first.solver, shapes, first.lr_mult,
                                      first.decay_mult, dtype=dtype, verbose=c.verbose,
                                      log_where=self.where, data=data)
        except ValueError as e:
            # An unknown solver type or lr_policy in the workers' INIT: every rank hears it
            # (ABORT), rather than the shard ending in a traceback and the workers timing out
            # (found by tests/ps/test_protocol_fuzz.py).
            raise RoundFailed(f"rank 0's INIT: {e}") from None
        prefix = c.snapshot_prefix or first.solver.snapshot_prefix or "ps"
        self.prefix = f"{prefix}_shard{c.shard}"
        if self.restored is not None:
            state, meta = self.restored
            if meta.get("blob_ids") != self.blob_ids:
                raise RoundFailed(f"{c.restore}: holds blobs {meta.get('blob_ids')}, the workers "
                                  f"register {self.blob_ids} (different net or number of shards, "
                                  "or workers with another overlap setting: --no-overlap places "
                                  "blobs on shards differently)")
            try:
                self.solver.load_state(state, c.restore)
            except ValueError as e:
                raise RoundFailed(str(e)) from None
            if meta.get("world_size") != c.world_size:
                self._log(f"{c.restore} was written with {meta.get('world_size')} worker(s), now "
                          f"{c.world_size}: the effective minibatch changes", level="W")
            self._log(f"restored {c.restore} (iteration {self.solver.iter})")
        else:
            for blob, values in zip(self.solver.blobs, first.arrays):
                blob.data[...] = values
        if first.iteration != self.solver.iter:
            raise RoundFailed(
                f"the workers start at iteration {first.iteration}, shard {c.shard} at "
                f"{self.solver.iter}: give every process snapshots of the same iteration "
                "(servers: --snapshot ..._shard{s}_iter_N.solverstate)")

    def _open_segments(self, joined: dict, shapes, dtype):
        """--ps-shm: map every rank's gradient segment and make the parameter segment;
        returns the parameter arrays the solver's blobs live in (None: no shared memory)."""
        named = [r for r in sorted(joined) if joined[r].segment is not None]
        if not named:
            return None
        if len(named) != len(joined):
            plain = sorted(set(joined) - set(named))
            raise RoundFailed(f"rank(s) {_ranks(named)} use shared memory (--ps-shm), rank(s) "
                              f"{_ranks(plain)} do not: start every worker alike")
        if self.link.enabled:
            raise RoundFailed("the workers use shared memory (--ps-shm), which link emulation "
                              "cannot delay: drop --link-gbps/--link-latency-ms or --ps-shm")
        self._position = {b: k for k, b in enumerate(self.blob_ids)}
        for r in named:
            try:
                self._grad_segs[r] = Segment.attach(joined[r].segment, shapes, dtype)
            except (OSError, ValueError) as e:
                raise RoundFailed(f"rank {r}: {e}") from None
        try:
            self._params_seg = Segment.create(f"p{self.config.shard}", shapes, dtype)
        except OSError as e:     # no room in the directory: every worker hears why
            raise RoundFailed(str(e)) from None
        self._log(f"shared memory: parameters in {self._params_seg.path}, gradients of "
                  f"{len(named)} rank(s) mapped ({self._params_seg.nbytes:,} bytes each)")
        return self._params_seg.arrays

    def _join_payloads(self, rank):
        """The answer to INIT: the shard's values (and its segment's name)."""
        out = [(i, b.data) for i, b in zip(self.blob_ids, self.solver.blobs)]
        if self._params_seg is not None:
            name = np.frombuffer(self._params_seg.name.encode("ascii"), dtype=np.uint8)
            out.insert(0, (P.SEGMENT_BLOB, name))
        return out



    # -------------------------------------------------------------- rounds
    def round(self) -> _RoundStats:
        """One BSP round: gather PUSH(t) of every bucket from every rank; each bucket is
        summed, updated and answered (PARAMS(t+1)) as soon as the last rank has pushed it."""
        c = self.config
        s = self.solver
        t = s.iter
        start = time.monotonic()
        deadline = start + c.timeout
        stats = _RoundStats()
        nb = len(self.buckets)
        pending: list[dict] = [{} for _ in range(nb)]    # per bucket: rank -> payloads
        first_at: list = [None] * nb                    # per bucket: its first push's arrival
        stats.rank_done_s = [0.0] * c.world_size
        stats.start_t = start
        left = nb
        rate = None
        p = s.param
        display = bool(p.display) and t % p.display == 0
        clipping = p.HasField("clip_gradients") and p.clip_gradients >= 0
        while left:
            got = self._next(deadline)
            if got is None:
                missing = [r for r in range(c.world_size) if any(r not in x for x in pending)]
                pushed = set(range(c.world_size)) - set(missing)
                raise RoundFailed(
                    f"iteration {t}: no gradients from rank(s) {_ranks(missing)} within "
                    f"{c.timeout:g} s (received from {_ranks(sorted(pushed)) or 'none'}"
                    + ("; when no worker pushes, another shard may be down"
                       if not any(pending) else "") + ")")
            rid, msg = got
            b, problem = self._check_push(msg, t, pending)
            if problem:
                self._reject(rid, problem, msg)
                continue
            arrived = time.monotonic()
            stats.bytes_in += sum(q.array.nbytes for q in msg.payloads)
            stats.last_rank = msg.rank
            pending[b][msg.rank] = msg.payloads
            if first_at[b] is None:
                first_at[b] = arrived
            stats.rank_done_s[msg.rank] = arrived - start
            if len(pending[b]) < c.world_size:
                continue
            # Every rank has pushed bucket b: sum in rank order (the result does not depend
            # on arrival order), x 1/W, update, answer.
            stats.wait_s = arrived - start
            stats.spread_s = max(stats.spread_s, arrived - first_at[b])
            u0 = time.monotonic()
            positions = self.buckets[b]
            grads = [[q.array for q in pending[b][r]] if positions else []
                     for r in range(c.world_size)]
            if clipping:   # one bucket, the whole shard (see _build): apply_update clips
                s.reduce_bucket(positions, grads, None)
                s.apply_update(display)
            else:
                if rate is None:
                    rate = s.begin_round(display)
                s.reduce_bucket(positions, grads, rate)
            pending[b] = {r: () for r in range(c.world_size)}   # done; frees the frames
            u1 = time.monotonic()
            stats.update_s += u1 - u0
            wrap = P.InShm if self._params_seg is not None else (lambda a: a)
            stats.bytes_out += self._send_all(
                Op.PARAMS, t + 1,
                lambda rank: [(self.blob_ids[k], wrap(s.blobs[k].data)) for k in positions])
            stats.send_s += time.monotonic() - u1
            left -= 1
        s.end_round()
        if self._params_seg is not None:   # every rank has pushed: each has mapped it
            self._params_seg.unlink()
        if p.snapshot and s.iter % p.snapshot == 0:
            self.snapshot()
        stats.iteration = t
        stats.round_s = time.monotonic() - start
        stats.tail_s = stats.round_s - stats.wait_s
        if display:
            self._log(f"Iteration {t}: waited {1e3 * stats.wait_s:.3g} ms for gradients (last: "
                      f"rank {stats.last_rank}), update {1e3 * stats.update_s:.3g} ms in {nb} "
                      f"bucket(s), {stats.bytes_in / 1e6:.3g} MB in, "
                      f"{stats.bytes_out / 1e6:.3g} MB out")
        return stats

    def _check_push(self, msg, t, pushed):
        """(bucket, None) for a valid PUSH(t), else (None, the reason to reject it);
        ``pushed[b]`` holds the ranks that pushed bucket b already."""
        if msg.op != Op.PUSH:
            return None, f"{msg.op.name} during iteration {t} (expected PUSH)"
        if msg.iteration != t:
            return None, f"PUSH for iteration {msg.iteration}, shard {self.config.shard} is at {t}"
        ids = tuple(q.blob_id for q in msg.payloads)
        b = self._bucket_of.get(ids)
        if b is None:
            if len(self.buckets) == 1:
                return None, (f"PUSH carries blobs {list(ids)}, shard {self.config.shard} holds "
                              f"{self.blob_ids}")
            return None, (f"PUSH carries blobs {list(ids)}, which are not one of shard "
                          f"{self.config.shard}'s {len(self.buckets)} buckets")
        if msg.rank in pushed[b]:
            what = "" if len(self.buckets) == 1 else f" bucket {b} of"
            return None, f"rank {msg.rank} pushed{what} iteration {t} twice"
        for q, k in zip(msg.payloads, self.buckets[b]):
            blob = self.solver.blobs[k]
            if q.array.shape != blob.shape or q.array.dtype != blob.dtype:
                return None, (f"blob {q.blob_id}: gradient {q.array.dtype}{list(q.array.shape)}, "
                              f"the parameter is {blob.dtype}{list(blob.shape)}")
        return b, None

    # ------------------------------------------------------------ snapshots
    def snapshot(self) -> str:
        path = f"{self.prefix}_iter_{self.solver.iter}.solverstate"
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        self.solver.save_state(path, {"shard": self.config.shard, "blob_ids": self.blob_ids,
                                      "world_size": self.config.world_size})
        self._log(f"Snapshotting shard {self.config.shard} to {path}")
        return path

    # ----------------------------------------------------------------- run
    def serve(self):
        """Join, then rounds until max_iter, then the final snapshot."""
        self.join()
        p = self.solver.param
        out = open(self.config.stats_path, "a") if self.config.stats_path else None
        try:
            while self.solver.iter < p.max_iter:
                stats = self.round()
                if out is not None:
                    out.write(json.dumps(dataclasses.asdict(stats)) + "\n")
        finally:
            if out is not None:
                out.close()
        if p.snapshot_after_train and (not p.snapshot or self.solver.iter % p.snapshot != 0):
            self.snapshot()
        self._log(f"Optimization Done (iteration {self.solver.iter}).")

    def run(self) -> int:
        """Serve until done (0) or failed (1); always closes the socket."""
        restore = _install_termination_handler()
        try:
            if self._sock is None:
                self.open()
            self.serve()
            return 0
        except (RoundFailed, _Terminated) as e:
            # The workers prefix the shard's name and address themselves.
            reason = "terminated by a signal" if isinstance(e, _Terminated) else str(e)
            self._log(reason, level="E")
            self.abort_all(reason)
            return 1
        finally:
            restore()
            self.close()


def _ranks(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


def _install_termination_handler():
    """SIGTERM/SIGINT end the shard through its failure path (the workers are
    told), once a message being sent has left whole; returns a function restoring the
    previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise _Terminated(signum)

    old = {s: signal.signal(s, whole_messages(handler)) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore():
        for s, h in old.items():
            signal.signal(s, h)
    return restore
