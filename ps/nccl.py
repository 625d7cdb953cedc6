"""NCCL all-reduce instead of a parameter server (``--comm nccl``), for the
GPUs of one host.

Every rank keeps the whole model and its solver history, as Caffe's own
multi-GPU training does: after backward the ranks sum their gradients with
``ncclAllReduce`` (through ``cupy.cuda.nccl``), scale them by 1/W, and each
applies the same local ``Solver.apply_update``, so the replicas stay equal
without ever sending parameters.  Rank 0's parameters are broadcast once at
the start.

ZeroMQ still does what NCCL cannot: rank 0 binds the rendezvous endpoint
(``--ps tcp://127.0.0.1:PORT``), hands every rank the NCCL unique id, and
runs a small barrier before each all-reduce.  The barrier costs one loopback
round trip per iteration and buys named failures: NCCL has no timeout, so a
rank that died would otherwise leave the others blocked inside the
collective.  With the barrier, a missing rank is named within the timeout;
a rank dying *inside* the collective is caught by a bounded wait on the
stream, which aborts the communicator.

Overlap (on by default; ``--no-overlap``, ``MINICAFFE_PS_OVERLAP=0`` turn it
off, and so does the solver's ``layer_wise_reduce: false`` where neither is given, as
in Caffe's NCCL), as PyTorch DDP's buckets.  The parameters are grouped into buckets of
at most ``bucket_mb`` (default 25 MiB), consecutive in the order backward
finishes them (:func:`ps.overlap.make_buckets`).  When backward has finished a
bucket (:class:`ps.overlap.GradientOverlap`), its work is queued on a
communication stream, behind an event recorded on the compute stream::

    compute  [backward of the layers of bucket 0] e0 [... bucket 1] e1 [...]   wait(done) update
    comm              wait(e0) pack0 allReduce0 x1/W unpack0  wait(e1) ...  done

A bucket whose diffs lie back to back in memory (one parameter, or a swap
plan's resident region) is all-reduced in place; the others are packed into
their slice of one flat buffer and unpacked after.  The sums are NCCL's, the
scale 1/W as before: the average of the gradients, as without overlap (for W
> 2 NCCL may add in another order when the buffers are cut differently: the
same within float32 rounding).  Every rank queues its buckets in the same
order (the order is a function of the net), as collectives require.  The
barrier moves to the update, after the collectives are queued: a rank that
never got there is still named within the timeout, and the bounded wait is on
the communication stream.  A communicator closed while a collective waits
for a dead peer is aborted, not destroyed (destroying would wait forever).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from minicaffe.log import log

from . import protocol as P
from .overlap import (DEFAULT_BUCKET_MB, ENV_OVERLAP, backward_order, make_buckets,
                      nccl_overlap_default)
from .protocol import Op, ProtocolError
from .transport import CurveServer, dealer, poll_until, router, send
from .worker import DataParallel, PSError


def _nccl():
    """cupy.cuda.nccl, or an error that says what is missing."""
    try:
        from cupy.cuda import nccl
    except Exception as e:  # ImportError, or CuPy built without NCCL
        raise RuntimeError(f"--comm nccl needs CuPy with NCCL support (cupy.cuda.nccl): "
                           f"{e}") from None
    if not getattr(nccl, "available", True):
        raise RuntimeError("--comm nccl: this CuPy was built without NCCL")
    return nccl


NCCL_ID_BYTES = 128


def _id_bytes(uid) -> bytes:
    """The 128 bytes of an NCCL unique id: CuPy 14 returns ``bytes``, older
    CuPy a tuple of (signed) char values."""
    if isinstance(uid, (bytes, bytearray)):
        raw = bytes(uid)
    else:
        raw = bytes(int(x) & 0xFF for x in uid)
    if len(raw) != NCCL_ID_BYTES:
        raise PSError(f"NCCL unique id of {len(raw)} bytes, expected {NCCL_ID_BYTES}")
    return raw


class Rendezvous:
    """Rank 0's ROUTER and the other ranks' DEALERs on one endpoint.

    Every wait is bounded: rank 0 waits ``timeout`` for the others and names
    the missing ranks; the others wait ``timeout + grace`` for rank 0, so
    rank 0's report (an ABORT naming the culprit) arrives first.
    """

    def __init__(self, endpoint, rank, world_size, timeout, curve_dir=None):
        import zmq
        self.zmq = zmq
        self.endpoint = endpoint
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.grace = max(1.0, 0.25 * timeout)
        self.ctx = zmq.Context()
        self.curve = None
        self.routes: dict[int, bytes] = {}
        limit = 1 << 20   # the largest message is the 128-byte NCCL id
        if rank == 0:
            if curve_dir:
                self.curve = CurveServer(self.ctx, curve_dir, where="ps.nccl")
            self.sock, _ = router(self.ctx, endpoint, max_frame_bytes=limit,
                                  send_timeout_s=timeout, curve=self.curve)
        else:
            self.sock = dealer(self.ctx, endpoint, max_frame_bytes=limit, send_timeout_s=timeout,
                               curve_dir=curve_dir)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)

    def _recv(self, deadline):
        """(routing id or None, Message) before the deadline, or None."""
        while True:
            if not poll_until(self.poller, deadline):
                if time.monotonic() >= deadline:
                    return None
                continue
            frames = self.sock.recv_multipart()
            rid = frames.pop(0) if self.rank == 0 else None
            try:
                msg = P.decode(frames, 1 << 20)
            except ProtocolError as e:
                if self.rank == 0:
                    log(f"rejected a message [{rid.hex()}]: {e}", level="W", where="ps.nccl")
                    continue
                raise PSError(f"rank 0 ({self.endpoint}) sent a malformed message: {e}") from None
            if msg.op == Op.ABORT:
                who = f"rank {msg.rank}" if self.rank == 0 else f"rank 0 ({self.endpoint})"
                raise PSError(f"{who} aborted: {msg.text()}")
            return rid, msg

    def _gather(self, op, iteration, what):
        """Rank 0: one ``op`` message from every other rank; returns {rank: (rid, msg)}."""
        deadline = time.monotonic() + self.timeout
        got = {}
        while len(got) < self.world_size - 1:
            r = self._recv(deadline)
            if r is None:
                missing = sorted(set(range(1, self.world_size)) - set(got))
                raise PSError(f"{what}: no word from rank(s) {', '.join(map(str, missing))} within "
                              f"{self.timeout:g} s")
            rid, msg = r
            known = self.routes.get(msg.rank)
            if (msg.op != op or not 0 < msg.rank < self.world_size or msg.rank in got
                    or (known is not None and known != rid)
                    or (iteration is not None and msg.iteration != iteration)):
                log(f"rejected {msg.op.name} from rank {msg.rank} for iteration {msg.iteration} "
                    f"during {what}", level="W", where="ps.nccl")
                continue
            got[msg.rank] = (rid, msg)
        return got

    def _await(self, op, iteration, what):
        """Rank r > 0: rank 0's ``op`` message."""
        r = self._recv(time.monotonic() + self.timeout + self.grace)
        if r is None:
            raise PSError(f"{what}: no answer from rank 0 ({self.endpoint}) within "
                          f"{self.timeout + self.grace:g} s")
        msg = r[1]
        if msg.op != op or (iteration is not None and msg.iteration != iteration):
            raise PSError(f"{what}: rank 0 sent {msg.op.name} for iteration {msg.iteration}")
        return msg

    def _send(self, frames, rid=None):
        try:
            send(self.sock, frames, rid)
        except self.zmq.ZMQError as e:
            raise PSError(f"rendezvous {self.endpoint}: cannot send: {e}") from None

    def unique_id(self, iteration: int, make_id) -> tuple:
        """Rank 0 makes the NCCL id and hands it out; all ranks must be at one iteration."""
        what = "NCCL rendezvous"
        if self.rank == 0:
            hello = self._gather(Op.HELLO, None, what)
            for r, (rid, msg) in sorted(hello.items()):
                self.routes[r] = rid
            for r, (_, msg) in sorted(hello.items()):
                if msg.iteration != iteration:
                    raise PSError(f"rank {r} starts at iteration {msg.iteration}, rank 0 at "
                                  f"{iteration}: resume every rank from the same snapshot")
            uid = _id_bytes(make_id())
            payload = np.frombuffer(uid, dtype=np.uint8)
            for r, rid in sorted(self.routes.items()):
                self._send(P.encode(Op.NCCL_ID, iteration, r, -1, [(-1, payload)]), rid)
            return uid
        self._send(P.encode(Op.HELLO, iteration, self.rank, -1))
        msg = self._await(Op.NCCL_ID, None, what)
        arr = msg.payloads[0].array
        if arr.dtype != np.uint8 or arr.size != NCCL_ID_BYTES:
            raise PSError(f"rank 0 ({self.endpoint}) sent an NCCL id of {arr.size} {arr.dtype}")
        if msg.iteration != iteration:
            raise PSError(f"rank 0 is at iteration {msg.iteration}, this rank at {iteration}")
        return bytes(arr)

    def barrier(self, iteration: int):
        """Everybody has its gradients of ``iteration`` ready (or a named failure)."""
        what = f"iteration {iteration}"
        if self.rank == 0:
            self._gather(Op.BARRIER, iteration, what)
            for r, rid in sorted(self.routes.items()):
                self._send(P.encode(Op.BARRIER, iteration, r, -1), rid)
        else:
            self._send(P.encode(Op.BARRIER, iteration, self.rank, -1))
            self._await(Op.BARRIER, iteration, what)

    def abort(self, reason: str):
        """Best effort: rank 0 tells everybody, another rank tells rank 0."""
        targets = sorted(self.routes.items()) if self.rank == 0 else [(0, None)]
        for r, rid in targets:
            try:
                frames = P.encode_text(Op.ABORT, -1, self.rank, -1, reason)
                send(self.sock, frames, rid or None, flags=self.zmq.NOBLOCK)
            except Exception:
                pass

    def close(self):
        self.sock.close(linger=1000)
        if self.curve is not None:
            self.curve.stop()
        self.ctx.term()


class NcclWorker(DataParallel):
    """Data-parallel training over NCCL; same interface as :class:`ps.worker.PSWorker`."""

    where = "ps.nccl"

    def __init__(self, solver, endpoint: str, rank: int, world_size: int, timeout: float = 120.0,
                 curve_dir: str | None = None, stats_path: str | None = None, data_hook=None,
                 slice_data: bool = True, overlap: bool | None = None,
                 bucket_mb: float = DEFAULT_BUCKET_MB):
        if solver.mode != "GPU":
            raise ValueError("--comm nccl needs GPU mode (--gpu N)")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"--rank {rank} out of range for --world-size {world_size}")
        self.nccl = _nccl()
        import cupy
        self.cupy = cupy
        super().__init__(solver, rank, world_size, data_hook, slice_data, stats_path)
        self.endpoint = endpoint
        self.timeout = timeout
        self.curve_dir = curve_dir
        self.params = solver.net.learnable_params
        dtypes = {q.dtype for q in self.params}
        if len(dtypes) > 1:
            raise ValueError(f"--comm nccl: parameters of several dtypes "
                             f"{sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop() if dtypes else np.dtype(np.float32)
        codes = {np.dtype(np.float32): self.nccl.NCCL_FLOAT32,
                 np.dtype(np.float64): self.nccl.NCCL_FLOAT64}
        if self.dtype not in codes:
            raise ValueError(f"--comm nccl: cannot all-reduce {self.dtype} parameters")
        self.nccl_dtype = codes[self.dtype]
        self.count = sum(q.count for q in self.params)
        self.flat = None      # (count,) device buffer: gradients, then parameters at the start
        self.comm = None
        self.rdv = None
        self.comm_stream = None
        how = "after backward (overlap off)"
        if overlap is None:   # the environment's, else the solver's layer_wise_reduce
            overlap = nccl_overlap_default(solver.param)
            if not overlap and ENV_OVERLAP not in os.environ:
                how = "after backward (the solver's layer_wise_reduce: false)"
        if overlap:
            if bucket_mb <= 0:
                raise ValueError(f"--bucket-mb must be positive, got {bucket_mb}")
            ids = make_buckets([q.nbytes for q in self.params], backward_order(solver.net),
                               max(1, int(bucket_mb * (1 << 20))))
            # bucket b: (its parameter ids, increasing; its slice [start, start + count) of flat)
            self.buckets, start = [], 0
            for b in ids:
                n = sum(self.params[i].count for i in b)
                self.buckets.append((b, start, n))
                start += n
            self._comm_done = cupy.cuda.Event(disable_timing=True)
            self._overlap_on([b for b, _, _ in self.buckets], self._bucket_ready)
            how = (f"in {len(self.buckets)} bucket(s) of at most {bucket_mb:g} MiB, overlapping "
                   "backward")
        self._log(f"rank {rank} of {world_size} on GPU {cupy.cuda.Device().id}; NCCL all-reduce "
                  f"of {self.count:,} values ({self.count * self.dtype.itemsize:,} bytes) {how}; "
                  f"rendezvous {endpoint}")

    # ----------------------------------------------------------- helpers
    def _pack(self, attr):
        o = 0
        for q in self.params:
            self.flat[o:o + q.count] = getattr(q, attr).reshape(-1)
            o += q.count

    def _unpack(self, attr):
        o = 0
        for q in self.params:
            getattr(q, attr)[...] = self.flat[o:o + q.count].reshape(q.shape)
            o += q.count

    def _wait_stream(self, stream, what):
        """Wait for ``stream`` without blocking forever: NCCL has no timeout."""
        deadline = time.monotonic() + self.timeout
        while not stream.done:
            if time.monotonic() > deadline:
                self.comm.abort()   # unblocks the collective's kernels
                self.comm = None
                raise PSError(f"{what} did not complete within {self.timeout:g} s (a rank died "
                              "inside the collective?); the NCCL communicator was aborted")
            time.sleep(50e-6)

    def _create_comm(self, uid):
        """ncclCommInitRank blocks until every rank calls it; a watchdog ends
        the process if one never does (the call cannot be interrupted)."""
        done = threading.Event()

        def watchdog():
            if not done.wait(self.timeout):
                log(f"rank {self.rank}: creating the NCCL communicator did not complete within "
                    f"{self.timeout:g} s (a rank died after the rendezvous?)", level="E",
                    where=self.where)
                os._exit(1)

        threading.Thread(target=watchdog, daemon=True, name="nccl-init-watchdog").start()
        try:
            try:
                return self.nccl.NcclCommunicator(self.world_size, uid, self.rank)
            except TypeError:
                # older CuPy takes the id as a tuple of signed chars (the
                # TypeError is raised converting the argument, before NCCL runs)
                signed = tuple(np.frombuffer(uid, dtype=np.int8).tolist())
                return self.nccl.NcclCommunicator(self.world_size, signed, self.rank)
        finally:
            done.set()

    # ----------------------------------------------------- DataParallel
    def _join(self):
        s = self.solver
        cp = self.cupy
        self.rdv = Rendezvous(self.endpoint, self.rank, self.world_size, self.timeout,
                              self.curve_dir)
        t0 = time.perf_counter()
        uid = self.rdv.unique_id(s.iter, self.nccl.get_unique_id)
        self.comm = self._create_comm(uid)
        self.flat = cp.empty(self.count, dtype=self.dtype)
        # One starting point: rank 0's parameters (fresh or restored).
        stream = cp.cuda.get_current_stream()
        self._pack("data")
        self.comm.bcast(self.flat.data.ptr, self.count, self.nccl_dtype, 0, stream.ptr)
        self._unpack("data")
        self._wait_stream(stream, "the initial broadcast")
        if self.overlap is not None:
            self.comm_stream = cp.cuda.Stream(non_blocking=True)
        self._log(f"NCCL communicator of {self.world_size} rank(s) ready at iteration {s.iter} "
                  f"in {time.perf_counter() - t0:.3g} s")

    def _synchronize(self, display):
        if self.overlap is not None:
            return self._synchronize_overlapped()
        s = self.solver
        cp = self.cupy
        stream = cp.cuda.get_current_stream()   # backward has finished (DataParallel syncs)
        self.rdv.barrier(s.iter)
        self._pack("diff")
        self.comm.allReduce(self.flat.data.ptr, self.flat.data.ptr, self.count, self.nccl_dtype,
                            self.nccl.NCCL_SUM, stream.ptr)
        if self.world_size > 1:
            self.flat *= self.dtype.type(1.0 / self.world_size)   # Caffe's 1/W average
        self._unpack("diff")
        self._wait_stream(stream, f"iteration {s.iter}: the all-reduce")
        nbytes = self.count * self.dtype.itemsize
        return nbytes, nbytes

    # ------------------------------------------------------------ overlap
    def _contiguous_diffs(self, ids, count):
        """The diffs of ``ids`` as one (count,) array when they lie back to back
        in memory in this order (then the all-reduce runs in place), else None."""
        cp = self.cupy
        first = self.params[ids[0]].diff
        ptr = first.data.ptr
        for i in ids:
            d = self.params[i].diff
            if not d.flags.c_contiguous or d.data.ptr != ptr:
                return None
            ptr += d.nbytes
        mem = cp.cuda.UnownedMemory(first.data.ptr, count * self.dtype.itemsize, first)
        return cp.ndarray((count,), self.dtype, cp.cuda.MemoryPointer(mem, 0))

    def _bucket_ready(self, b, event):
        """Bucket ``b``'s diffs are final (called in backward, or by the update's
        flush): queue its all-reduce on the communication stream behind
        ``event``, recorded on the compute stream after the kernels that wrote
        them.  Nothing here waits on the host."""
        ids, start, count = self.buckets[b]
        cs = self.comm_stream
        cs.wait_event(event)
        with cs:
            buf = self._contiguous_diffs(ids, count)
            packed = buf is None
            if packed:
                buf = self.flat[start:start + count]
                o = 0
                for i in ids:
                    q = self.params[i]
                    buf[o:o + q.count] = q.diff.reshape(-1)
                    o += q.count
            self.comm.allReduce(buf.data.ptr, buf.data.ptr, count, self.nccl_dtype,
                                self.nccl.NCCL_SUM, cs.ptr)
            if self.world_size > 1:
                buf *= self.dtype.type(1.0 / self.world_size)   # Caffe's 1/W average
            if packed:
                o = 0
                for i in ids:
                    q = self.params[i]
                    q.diff[...] = buf[o:o + q.count].reshape(q.shape)
                    o += q.count

    def _synchronize_overlapped(self):
        s = self.solver
        self.overlap.flush()                   # buckets backward did not finish (none, normally)
        self.rdv.barrier(s.iter)               # every rank queued its all-reduces, or it is named
        self._comm_done.record(self.comm_stream)
        self.cupy.cuda.get_current_stream().wait_event(self._comm_done)  # the update reads them
        self._wait_stream(self.comm_stream, f"iteration {s.iter}: the all-reduce")
        self.overlap.reset()
        nbytes = self.count * self.dtype.itemsize
        return nbytes, nbytes

    def _after_sync(self, display):
        # Every replica applies the same update to the same parameters.
        type(self.solver).apply_update(self.solver, False)

    def _abort(self, reason):
        if self.rdv is not None:
            self.rdv.abort(reason)

    def _close(self):
        self._overlap_off()
        if self.comm is not None:
            if self.comm_stream is not None and not self.comm_stream.done:
                self.comm.abort()     # a collective waits for a peer that will not come
            else:
                self.comm.destroy()
            self.comm = None
        if self.rdv is not None:
            self.rdv.close()
            self.rdv = None
