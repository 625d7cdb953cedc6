"""When a worker copies the parameter server's answers into its net (issue 6).

A shard answers each bucket of new parameters as soon as every worker has pushed it
(ps/overlap.py), so most answers are back before this worker's backward ends.  Where
they go into the net is the copy-up mode (``$MINICAFFE_PS_COPY_UP``, ``--copy-up``):

``backward`` (the CPU's default)
    the round thread (ps/rounds.py) copies each answer into the net as it comes.  Its
    blobs' backward is over, so nothing reads them before the next forward.
``update``
    the round thread takes the answers (decoded, not copied); the update copies them
    all into the net on the main thread, then the next iteration starts.  A GPU's
    copies from ZeroMQ's pageable buffers hold the host thread.
``forward`` (the GPU's default)
    the round thread hands each answer to a copy thread, which copies it into its
    pinned staging buffer (host memory, off the main thread).  At the update, once
    every answer is in, the copy thread issues the host-to-device
    copies bucket by bucket in the order the next forward needs them, on a stream of
    their own, and records an event per bucket.  Before each forward layer the compute
    stream waits for the events of the buckets holding that layer's parameters, so the
    forward starts as soon as the first layers' parameters are up, while the rest are
    still copying.  Backward's host-to-device direction carries the swap plan's
    prefetches (session 14, call 3: copying during backward raised ResNet-152's
    compute from 196 to 268 ms on 4 H200s); forward's offloads use the other direction.

Staging reuse (GPU): a bucket's answer goes into the pinned buffers its gradients
were pushed from.  That is safe: a shard answers a bucket only once it has all of it
from every worker, so this worker's send from those buffers is over; and the next
device-to-host copy into them waits (copy stream) for backward's event of the same
layers, whose forward waited for this copy.

Everything else that reads the parameters (the test nets, a snapshot, the caller
after ``step``) calls :meth:`CopyUp.land` first.  On the CPU the same thread and
events run, with ``np.copyto`` as the copy and no stream: the tests check the
waits that way.  :func:`forward_needs` is pure.
"""
from __future__ import annotations

import ctypes
import os
import queue
import threading
import time

import numpy as np

ENV_COPY_UP = "MINICAFFE_PS_COPY_UP"
# 0: the copy thread issues its copies through CuPy's ndarray.set (see DriverCopies)
ENV_DRIVER_COPIES = "MINICAFFE_PS_DRIVER_COPIES"
COPY_UP_MODES = ("backward", "update", "forward")


def copy_up_mode(on_gpu: bool, choice: str | None = None, env=None) -> str:
    """The copy-up mode: ``choice`` (``--copy-up``), else ``$MINICAFFE_PS_COPY_UP``, else
    ``forward`` on the GPU and ``backward`` on the CPU."""
    env = os.environ if env is None else env
    mode = choice or env.get(ENV_COPY_UP, "").strip().lower() or None
    if mode is None:
        return "forward" if on_gpu else "backward"
    if mode not in COPY_UP_MODES:
        source = "--copy-up" if choice else f"${ENV_COPY_UP}"
        raise ValueError(f"{source}={mode!r}: expected one of {', '.join(COPY_UP_MODES)}")
    return mode


def forward_needs(net, buckets: list) -> dict:
    """{layer index: [bucket ids]}: the buckets (lists of learnable parameter ids) whose
    parameters a forward must have before that layer runs, each at the first layer
    that holds one of them.  A bucket no layer holds (an empty one) is absent."""
    from .overlap import learnable_index
    first: dict = {}
    for flat, q in enumerate(learnable_index(net)):
        li = net.param_layer_index[flat][0]
        first[q] = min(li, first.get(q, li))
    out: dict = {}
    for b, ids in enumerate(buckets):
        users = [first[i] for i in ids if i in first]
        if users:
            out.setdefault(min(users), []).append(b)
    return out


class CopyError(RuntimeError):
    pass


class DriverCopies:
    """Host-to-device copies issued with the GIL held: ``cuMemcpyAsync`` of the CUDA driver
    through ``ctypes.PyDLL``.

    CuPy's ``ndarray.set`` lets go of the GIL around each copy it issues.  The copy thread
    issues one per parameter (467 for ResNet-152) while the main thread issues the forward,
    which lets go of the GIL around every launch too, so the two threads handed the GIL to
    each other about a thousand times per iteration: on 4 H200s (2026-11-28, session 19)
    the main thread of a worker blocked 1,600 to 1,900 times during compute, its CPU time
    grew from 135 ms (no parameter server) to 160-190 ms, and it fell behind the GPU.  A
    PyDLL call keeps the GIL, so a bucket's copies go out in one stretch of about 2 us a
    copy, and the main thread waits at most once for them.

    The copy thread must make the main thread's context current (:meth:`bind`) before its
    first copy.  Raises OSError where the driver cannot be loaded or has no context current
    (the caller falls back to ``ndarray.set``)."""

    def __init__(self):
        lib = ctypes.PyDLL("libcuda.so.1")
        self._memcpy = lib.cuMemcpyAsync
        self._memcpy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                                 ctypes.c_void_p]
        self._memcpy.restype = ctypes.c_int
        self._set_ctx = lib.cuCtxSetCurrent
        self._set_ctx.argtypes = [ctypes.c_void_p]
        self._set_ctx.restype = ctypes.c_int
        get_ctx = lib.cuCtxGetCurrent
        get_ctx.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        get_ctx.restype = ctypes.c_int
        ctx = ctypes.c_void_p()
        rc = get_ctx(ctypes.byref(ctx))
        if rc != 0 or not ctx.value:
            raise OSError(f"cuCtxGetCurrent: CUresult {rc}, no CUDA context current")
        self.ctx = ctx.value

    def bind(self):
        """Make the context of the constructing thread current on this one."""
        rc = self._set_ctx(self.ctx)
        if rc != 0:
            raise RuntimeError(f"cuCtxSetCurrent failed: CUresult {rc}")

    def copy(self, dst_ptr: int, src_ptr: int, nbytes: int, stream_ptr: int):
        """``nbytes`` from ``src_ptr`` to ``dst_ptr`` on the stream; the driver tells host from
        device by the addresses (unified addressing).  The host side must be pinned or
        registered, else the copy is synchronous and holds the GIL while it runs."""
        if nbytes:
            rc = self._memcpy(dst_ptr, src_ptr, nbytes, stream_ptr)
            if rc != 0:
                raise RuntimeError(f"cuMemcpyAsync of {nbytes} bytes failed: CUresult {rc}")

    def up(self, dst, src, stream_ptr: int) -> bool:
        """dst (a cupy array) <- src (a host array); False (nothing issued) unless both are
        C-contiguous and of the same size."""
        if not (dst.flags.c_contiguous and src.flags.c_contiguous and dst.nbytes == src.nbytes):
            return False
        self.copy(dst.data.ptr, src.ctypes.data, dst.nbytes, stream_ptr)
        return True

    def down(self, dst, src, stream_ptr: int) -> bool:
        """dst (a host array) <- src (a cupy array); as :meth:`up`."""
        if not (dst.flags.c_contiguous and src.flags.c_contiguous and dst.nbytes == src.nbytes):
            return False
        self.copy(dst.ctypes.data, src.data.ptr, src.nbytes, stream_ptr)
        return True


def driver_copies(env=None):
    """A :class:`DriverCopies` for the calling thread's context, or None where
    ``$MINICAFFE_PS_DRIVER_COPIES`` is 0 or the driver cannot be used (CuPy's copies then)."""
    env = os.environ if env is None else env
    if env.get(ENV_DRIVER_COPIES, "1").strip() == "0":
        return None
    try:
        import cupy
        cupy.cuda.Device().synchronize()   # the runtime's primary context is current
        return DriverCopies()
    except (OSError, AttributeError, ImportError):
        return None


class CopyUp:
    """The ``forward`` copy-up of one worker: a copy thread, an event per bucket.

    Args:
        params: the net's learnable blobs (``.data`` is written).
        buckets: learnable parameter ids per bucket (ps.worker's bucket order).
        order: bucket ids in the order the next forward needs them.
        staging: pinned host arrays per parameter (GPU), or None (CPU: the answer's
            array is copied into the net directly).
        timeout: seconds a waiter gives the thread before it reports it stuck.
        gpu: copy up to a device (default: with staging buffers).
        direct: the answers' arrays stay valid and are pinned until the copies are done
            (--ps-shm: the shard's parameter segment, registered with CUDA), so they go up
            from there, without the copy into staging.

    Per round: :meth:`arrived` for every answered blob (main thread, any time after its
    bucket was pushed), :meth:`go` once all are in, :meth:`wait` per bucket before a
    forward layer, or :meth:`land` for all of them.
    """

    def __init__(self, params, buckets: list, order: list, staging=None,
                 timeout: float = 120.0, gpu: bool | None = None, direct: bool = False):
        self.params = params
        self.buckets = [list(b) for b in buckets]
        # every bucket is issued each round: those ``order`` leaves out go last
        self.order = list(order) + [b for b in range(len(self.buckets)) if b not in set(order)]
        self.staging = staging
        self.timeout = timeout
        self.gpu = staging is not None if gpu is None else bool(gpu)
        self.direct = bool(direct)
        if self.gpu:
            import cupy
            self._device = cupy.cuda.Device()
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.events = [cupy.cuda.Event(disable_timing=True) for _ in self.buckets]
            self._current_stream = cupy.cuda.get_current_stream
            self._driver = driver_copies()
        self._issued = [threading.Event() for _ in self.buckets]
        self._waited = [True] * len(self.buckets)    # by the current stream, this round
        self._open = False        # a round's copies are issued or due and not all waited for
        self._arrays: dict = {}   # blob id -> answer (CPU: until go)
        self._jobs: queue.Queue = queue.Queue()
        self._error = None
        self.host_s = 0.0         # the thread's time copying into staging, in all
        self.issue_s = 0.0        # the thread's time issuing the copies up, in all
        self.delay_s = 0.0        # tests: the thread sleeps this long before each bucket
        self._thread = threading.Thread(target=self._run, name="ps-copy-up", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ main thread
    @property
    def open(self) -> bool:
        """Whether the last round's copies are not all waited for yet."""
        return self._open

    def settle(self):
        """Before a new round's gradients go into the staging buffers: the last round's
        copies are waited for, by the current stream and (GPU) by the host.  A no-op when
        the forward waited for every bucket, which orders them already."""
        if self._open:
            self.land()
            if self.gpu:
                self.stream.synchronize()

    def arrived(self, i: int, array):
        """Blob i's new values (a host array that stays valid until :meth:`go`'s copies).
        Direct (the shards' segments): kept as it is, without waking the copy thread (one
        wake-up per blob handed the GIL back and forth during backward)."""
        if self.direct:
            self._arrays[i] = array     # read by the thread only after go()
        else:
            self._jobs.put(("host", i, array))

    def go(self):
        """Every answer of the round is in: issue the copies up, in ``order``."""
        self._open = True
        for b in range(len(self.buckets)):
            self._issued[b].clear()
            self._waited[b] = False
        self._jobs.put(("go", None, None))

    def wait(self, buckets):
        """The current stream waits for these buckets' copies (the host waits only until the
        thread has issued them)."""
        for b in buckets:
            if self._waited[b]:
                continue
            if not self._issued[b].wait(self.timeout):
                raise CopyError(f"the copy-up thread did not issue bucket {b} within "
                                f"{self.timeout:g} s")
            self._check()
            if self.gpu:
                self._current_stream().wait_event(self.events[b])
            self._waited[b] = True
        if all(self._waited):
            self._open = False

    def land(self):
        """Every copy of the round is waited for (by the current stream)."""
        if self._open:
            self.wait(range(len(self.buckets)))

    def close(self):
        self._jobs.put(None)
        self._thread.join(timeout=10.0)

    def _check(self):
        if self._error is not None:
            raise CopyError(f"the copy-up thread failed: {self._error}")

    # ------------------------------------------------------------ the thread
    def _run(self):
        try:
            if self.gpu:
                self._device.use()
                if self._driver is not None:
                    self._driver.bind()
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                kind, i, array = job
                if kind == "host":
                    t0 = time.perf_counter()
                    if self.gpu and not self.direct:
                        np.copyto(self.staging[i], np.asarray(array).reshape(self.staging[i].shape))
                    else:
                        self._arrays[i] = array
                    self.host_s += time.perf_counter() - t0
                else:
                    self._issue_all()
        except BaseException as e:   # reported to the waiters; never lost
            self._error = f"{type(e).__name__}: {e}"
            for ev in self._issued:
                ev.set()

    def _issue_all(self):
        for b in self.order:
            if self.delay_s:
                time.sleep(self.delay_s)
            t0 = time.perf_counter()
            for i in self.buckets[b]:
                q = self.params[i]
                if self.gpu:
                    src = (self._arrays.pop(i).reshape(q.data.shape) if self.direct
                           else self.staging[i])
                    if self._driver is None or not self._driver.up(q.data, src, self.stream.ptr):
                        q.data.set(src, stream=self.stream)
                else:
                    np.copyto(q.data, np.asarray(self._arrays.pop(i)).reshape(q.data.shape))
            if self.gpu:
                self.events[b].record(self.stream)
            self.issue_s += time.perf_counter() - t0
            self._issued[b].set()
