"""Shared-memory data plane for workers and shards on one host (``--ps-shm``).

Through ZeroMQ every byte of a round is copied several times on the host: into the
socket, out of it, and (GPU) from the received frame into a pinned buffer before it can
go up.  On one host those copies are the parameter server's cost, not the network's:
ResNet-152 at W = 1 on an H200 lost 17-31 ms after backward waiting for answers whose
shard had finished 2 ms after the last push (2026-11-22, session 17).  With ``--ps-shm``
the bytes stay where they are made:

* each worker makes one *gradient segment* per shard, laid out as that shard's blobs
  (:func:`layout`); its device-to-host copies write the gradients there, and a PUSH carries
  headers only (the protocol's ``FLAG_SHM``: "the values lie in the sender's segment at
  this blob's place");
* each shard makes one *parameter segment*; its solver's blobs live in it, so the update
  writes the new values in place, and a PARAMS answer carries headers only;
* on a GPU worker both are registered with CUDA (``cudaHostRegister``), so the copies to
  and from the device run asynchronously straight from them, like pinned buffers.

ZeroMQ still carries every message (joins, headers, failures, ABORT, timeouts): only the
values move through the segments.  Reusing a segment every round is safe because of BSP:
a worker writes bucket g's gradients of round t + 1 only after its forward used g's answer
of round t, which the shard sent after it had summed g's gradients of round t; a shard
overwrites g's parameters of round t + 1 only after every worker pushed g again, which each
did after its forward had copied g's values of round t up (the copy is ordered before the
backward that made the push).

Segments are files in ``$MINICAFFE_PS_SHM_DIR`` (default ``/dev/shm``) mapped with mmap;
on a GPU that directory must be a tmpfs: CUDA registers tmpfs mappings, not mappings of
files on a disk's file system (cudaErrorInvalidValue on an H200 host, 2026-11-22).
names carry the creator's process id.  Each name is removed as soon as the peers have
opened it (a worker's after the join, a shard's after its first round), so that a process
killed later leaves nothing behind.  A peer on another host cannot open them: the join
fails, naming the segment.
"""
from __future__ import annotations

import mmap
import os
import re
import secrets

import numpy as np

ENV_DIR = "MINICAFFE_PS_SHM_DIR"
PREFIX = "mcps-"
# a name a peer may ask us to open: ours, without any path in it
NAME_RE = re.compile(r"^mcps-[0-9]+-[0-9a-f]+-[a-z0-9]+$")
ALIGN = 256     # each blob starts on its own cache lines (and a GPU copy's favoured alignment)


def shm_dir() -> str:
    d = os.environ.get(ENV_DIR, "").strip()
    if d:
        return d
    return "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"


def available() -> bool:
    """Whether a tmpfs for segments is at hand: ``$MINICAFFE_PS_SHM_DIR`` set, or
    ``/dev/shm`` (the fallback, /tmp, is for CPU workers only)."""
    return bool(os.environ.get(ENV_DIR, "").strip()) or os.path.isdir("/dev/shm")


def layout(shapes, dtype) -> tuple:
    """(byte offset of each blob, total bytes) of a segment holding ``shapes`` of ``dtype``
    in this order, each blob aligned to :data:`ALIGN` bytes."""
    itemsize = np.dtype(dtype).itemsize
    offsets, at = [], 0
    for shape in shapes:
        offsets.append(at)
        n = int(np.prod(shape, dtype=np.int64)) * itemsize
        at += -(-n // ALIGN) * ALIGN
    return offsets, max(at, ALIGN)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a parameter-server shared-memory segment name")
    return name


class Segment:
    """One mapped segment and the arrays placed in it.

    ``Segment.create(what, shapes, dtype)`` makes a new one (zero-filled) under a fresh
    name; ``Segment.attach(name, shapes, dtype)`` opens a peer's, whose size must be the
    layout's exactly.  ``arrays[k]`` is blob k's array (its shape, C order)."""

    def __init__(self, name, path, mm, shapes, dtype, owner):
        self.name = name
        self.path = path
        self.owner = owner
        self._mm = mm
        self.dtype = np.dtype(dtype)
        self.offsets, self.nbytes = layout(shapes, dtype)
        buf = np.frombuffer(mm, dtype=np.uint8, count=self.nbytes)
        self.arrays = [buf[o:o + int(np.prod(s, dtype=np.int64)) * self.dtype.itemsize]
                       .view(self.dtype).reshape(tuple(s))
                       for o, s in zip(self.offsets, shapes)]
        self._base = buf
        self._registered = None

    @classmethod
    def create(cls, what: str, shapes, dtype) -> "Segment":
        if not re.match(r"^[a-z0-9]+$", what):
            raise ValueError(f"segment kind {what!r}: lowercase letters and digits only")
        _, nbytes = layout(shapes, dtype)
        d = shm_dir()
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{what}"
        path = os.path.join(d, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            # reserve the pages now: a tmpfs that runs out of room later kills the process
            # that touches the missing page (SIGBUS) instead of raising
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                raise OSError(e.errno, f"shared-memory segment {path}: no room for {nbytes:,} "
                                       f"bytes in {d} ({e.strerror}); free some, or point "
                                       f"${ENV_DIR} at a larger tmpfs") from None
            mm = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return cls(name, path, mm, shapes, dtype, owner=True)

    @classmethod
    def attach(cls, name: str, shapes, dtype) -> "Segment":
        check_name(name)
        path = os.path.join(shm_dir(), name)
        _, nbytes = layout(shapes, dtype)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shared-memory segment {path} not found: --ps-shm needs the workers and "
                "the shards on one host (and the same $" + ENV_DIR + ")") from None
        try:
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise ValueError(f"shared-memory segment {path} holds {size} bytes, the blobs "
                                 f"need {nbytes}: the peers disagree on the blobs")
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        return cls(name, path, mm, shapes, dtype, owner=False)

    def unlink(self):
        """Remove the name (the mappings stay valid); the creator's job, done once the peers
        have opened it."""
        if self.owner and self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None

    def register(self):
        """Page-lock the mapping for CUDA (``cudaHostRegister``): copies to and from the
        device then run asynchronously from it, as from pinned memory."""
        if self._registered is None:
            import cupy
            ptr = self._base.ctypes.data
            try:
                cupy.cuda.runtime.hostRegister(ptr, self.nbytes, 0)
            except cupy.cuda.runtime.CUDARuntimeError as e:
                # seen on an H200 host (2026-11-22): tmpfs mappings register, mappings of
                # files on a disk's file system fail with cudaErrorInvalidValue
                raise RuntimeError(
                    f"cannot register shared-memory segment {self.name} in {shm_dir()} with "
                    f"CUDA ({e}): GPU workers need its directory on a tmpfs such as /dev/shm "
                    f"(${ENV_DIR})") from None
            self._registered = ptr

    def close(self):
        """Unregister, unlink (creator) and unmap.  Views still held elsewhere keep the
        mapping alive until they go (the unmap is then left to the garbage collector)."""
        if self._registered is not None:
            import cupy
            try:
                cupy.cuda.runtime.hostUnregister(self._registered)
            except Exception:   # pragma: no cover - the context is gone at exit
                pass
            self._registered = None
        self.unlink()
        self.arrays = []
        self._base = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:   # an array of it is still referenced
                pass
            self._mm = None


class WorkerSegments:
    """A worker's side of the shared-memory data plane.

    Args:
        rank: the worker's rank (in its segments' names).
        shards: blob ids per shard (sorted; the order the segments lay them out in).
        shapes: the shape of every learnable blob, by blob id.
        dtype: the blobs' dtype.
        gpu: register the mappings with CUDA.

    Makes one gradient segment per shard at once (:meth:`name` goes into INIT); maps each
    shard's parameter segment when the shard's answer to INIT names it (:meth:`attach`).
    """

    def __init__(self, rank: int, shards, shapes, dtype, gpu: bool = False):
        self.shards = [list(ids) for ids in shards]
        self.shapes = shapes
        self.dtype = np.dtype(dtype)
        self.gpu = gpu
        self._where = {}           # blob id -> (shard, position)
        for s, ids in enumerate(self.shards):
            for k, i in enumerate(ids):
                self._where[i] = (s, k)
        self.grads: list = []
        self.params: list = [None] * len(self.shards)
        try:
            for s, ids in enumerate(self.shards):
                seg = Segment.create(f"g{rank}s{s}", [shapes[i] for i in ids], self.dtype)
                self.grads.append(seg)
                if gpu:
                    seg.register()
        except BaseException:
            self.close()
            raise

    def name(self, s: int) -> str:
        return self.grads[s].name

    def grad(self, i: int):
        """Blob i's place in its shard's gradient segment."""
        s, k = self._where[i]
        return self.grads[s].arrays[k]

    def attach(self, s: int, name: str):
        """Map shard s's parameter segment (named in its answer to INIT)."""
        if self.params[s] is not None:
            return
        seg = Segment.attach(name, [self.shapes[i] for i in self.shards[s]], self.dtype)
        self.params[s] = seg
        if self.gpu:
            seg.register()

    def placed(self, rank, shard, blob_id, dtype, shape):
        """A ``FLAG_SHM`` payload of shard ``shard``: its blob in the shard's segment."""
        from .protocol import ProtocolError
        seg = self.params[shard] if 0 <= shard < len(self.params) else None
        if seg is None:
            raise ProtocolError(f"shard {shard} sent a shared-memory payload before naming "
                                "its segment")
        where = self._where.get(blob_id)
        if where is None or where[0] != shard:
            raise ProtocolError(f"blob {blob_id} is not on shard {shard}")
        a = seg.arrays[where[1]]
        if a.dtype != dtype or a.shape != tuple(shape):
            raise ProtocolError(f"blob {blob_id}: the header says {dtype}{list(shape)}, the "
                                f"segment holds {a.dtype}{list(a.shape)}")
        return a

    def unlink(self):
        """The shards have mapped the gradient segments (they answered INIT): drop the names."""
        for seg in self.grads:
            seg.unlink()

    def close(self):
        for seg in [*self.grads, *self.params]:
            if seg is not None:
                seg.close()
        self.grads = []
        self.params = [None] * len(self.shards)
