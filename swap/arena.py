"""Arenas: one device buffer of exactly the budget, one pinned host buffer (paper, section 5).

The runtime memory manager of AccUDNN "allocate[s] all the given memory budget as an integrated
buffer pool with one cudaMalloc() call ... the memory manager then allocates GPU buffer from the
buffer pool directly for each allocate operation at runtime, accordingly, the release operation
returns the buffer space back to the buffer pool" (section 5).  Here that pool is split in two
layers, so that the planner can use the very allocator that the runtime replays:

* :class:`Arena` is pure bookkeeping: an offset allocator (best fit, free blocks coalesced) over
  ``capacity`` bytes.  The planner (:mod:`swap.plan`) runs it over a plan's allocate/release
  sequence to give every allocation a fixed offset; the executor runs it again with those
  offsets (``allocate(n, offset=...)`` checks the region is free), so an overlap or a region
  beyond the budget is a bug that raises, never silent corruption.  It measures the high-water
  mark (highest byte ever handed out) and the peak bytes in use.
* :class:`DeviceArena` adds the backing memory: in GPU mode one CuPy allocation of exactly the
  capacity (``cudaMalloc`` through ``cupy.cuda.Memory``, outside CuPy's pool, which keeps
  per-stream free lists and would hide the budget); in CPU mode a NumPy byte array stand-in with
  the same accounting.  :meth:`DeviceArena.view` returns a 1-d typed view of a region, which
  is what :meth:`minicaffe.blob.Blob.bind_data` receives.
* :class:`HostArena` is the pinned host buffer offloaded data lives in, allocated once
  (``cupy.cuda.alloc_pinned_memory``; pageable copies run at a fifth of the speed, see
  DESIGN.md), or plain NumPy in CPU mode.
* :class:`ScratchReserve` is the bookkeeping of the arena's last region, from which
  :mod:`swap.runtime` serves every CuPy allocation made while an executor runs (layer
  temporaries, workspaces allocated through CuPy): the memory nobody declares still comes from
  the budget.  Pure Python, so CPU tests drive it exactly as the GPU allocator does.

GPU views are made as their own ``cupy.ndarray`` over a ``MemoryPointer`` into the arena, not
as slices of one arena-sized array: CuPy gives a slice or ``view()`` the 32/64-bit indexing
flag of its source (``_index_32_bits``), so slices of an arena larger than 2 GiB would make
every elementwise kernel on a blob use 64-bit index arithmetic (integer division per
dimension where an array is broadcast or strided), which can slow the unfused BatchNorm and
Scale work of a ResNet.

Sizes are rounded up to :data:`ALIGN` bytes, the alignment cuBLAS and the vision kernels like;
the planner accounts in aligned bytes, so eq. (4) is checked on what the arena really reserves.
"""
from __future__ import annotations

import bisect
import threading
import weakref

import numpy as np

ALIGN = 512


def align(nbytes: int, alignment: int = ALIGN) -> int:
    """``nbytes`` rounded up to a multiple of ``alignment`` (0 stays 0)."""
    return -(-int(nbytes) // alignment) * alignment


class ArenaError(RuntimeError):
    """An allocation that does not fit, or a region used twice: a planning or executor bug."""


class Arena:
    """Best-fit offset allocator over ``capacity`` bytes; bookkeeping only.

    Free blocks are kept sorted by offset and merged with their neighbours on release.
    ``allocate(n)`` takes the smallest hole that holds ``n`` bytes (lowest offset on ties), and
    the free space at the end of the arena only when no hole fits; ``allocate(n, offset=o)``
    takes exactly ``[o, o + n)``, which must be free.
    """

    def __init__(self, capacity: int, alignment: int = ALIGN):
        if capacity < 0:
            raise ValueError(f"arena capacity must be >= 0, got {capacity}")
        self.capacity = int(capacity)
        self.alignment = alignment
        self._starts: list[int] = [0] if capacity else []   # free blocks, sorted by start
        self._sizes: list[int] = [self.capacity] if capacity else []
        self.live: dict[int, int] = {}                      # offset -> size of each allocation
        self.in_use = 0
        self.peak_in_use = 0
        self.high_water = 0                                  # max(offset + size) ever handed out

    # ------------------------------------------------------------- queries
    def free_blocks(self) -> list[tuple[int, int]]:
        """(offset, size) of every free block, by offset."""
        return list(zip(self._starts, self._sizes))

    def largest_free(self) -> int:
        return max(self._sizes, default=0)

    # ------------------------------------------------------------ allocate
    def allocate(self, nbytes: int, offset: int | None = None) -> int:
        """Reserve ``nbytes`` (rounded up to the alignment); return its offset."""
        n = align(nbytes, self.alignment)
        if n == 0:
            raise ValueError("cannot allocate 0 bytes")
        if offset is None:
            # Best fit among the holes; the block that runs to the end of the arena (the
            # "wilderness", as in dlmalloc) only when no hole fits.  The layout of a sequence
            # of allocations and releases then does not depend on the capacity: it fits any
            # arena at least as large as its high-water mark, and no smaller one.
            best = -1
            last = len(self._sizes) - 1
            tail = last if last >= 0 and self._starts[last] + self._sizes[last] == self.capacity \
                else -1
            for i, size in enumerate(self._sizes):
                if i != tail and size >= n and (best < 0 or size < self._sizes[best]):
                    best = i
                    if size == n:
                        break
            if best < 0 and tail >= 0 and self._sizes[tail] >= n:
                best = tail
            if best < 0:
                raise ArenaError(
                    f"no free block of {n} bytes (in use {self.in_use} of {self.capacity}, "
                    f"largest free block {self.largest_free()})")
            offset = self._starts[best]
        self._take(offset, n)
        self.live[offset] = n
        self.in_use += n
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        self.high_water = max(self.high_water, offset + n)
        return offset

    def _take(self, offset: int, n: int):
        """Remove [offset, offset + n) from the free list; it must lie inside one free block."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0 or offset + n > self._starts[i] + self._sizes[i]:
            raise ArenaError(
                f"region [{offset}, {offset + n}) is not free in an arena of {self.capacity} bytes "
                f"(live regions overlap it or it passes the end)")
        start, size = self._starts[i], self._sizes[i]
        del self._starts[i], self._sizes[i]
        tail = start + size - (offset + n)
        if tail:
            self._starts.insert(i, offset + n)
            self._sizes.insert(i, tail)
        if offset > start:
            self._starts.insert(i, start)
            self._sizes.insert(i, offset - start)

    # ------------------------------------------------------------- release
    def free(self, offset: int) -> int:
        """Return the allocation at ``offset`` to the free list; returns its size."""
        n = self.live.pop(offset, None)
        if n is None:
            raise ArenaError(f"free of offset {offset}, which holds no allocation")
        self.in_use -= n
        i = bisect.bisect_left(self._starts, offset)
        start, size = offset, n
        if i < len(self._starts) and self._starts[i] == offset + n:      # merge with the next
            size += self._sizes[i]
            del self._starts[i], self._sizes[i]
        if i > 0 and self._starts[i - 1] + self._sizes[i - 1] == offset:  # and the previous
            start = self._starts[i - 1]
            size += self._sizes[i - 1]
            del self._starts[i - 1], self._sizes[i - 1]
            i -= 1
        self._starts.insert(i, start)
        self._sizes.insert(i, size)
        return n

    def __repr__(self):
        return (f"<Arena {self.in_use}/{self.capacity} bytes in use, "
                f"{len(self.live)} regions, high water {self.high_water}>")


_LIVE = weakref.WeakSet()      # GPU arenas whose memory this process has not released


def device_memory_report(xp) -> str:
    """One line on where the device memory of this process is: free and total (the driver),
    CuPy's default pool (used and cached), and the arenas not yet released."""
    free, total = xp.cuda.runtime.memGetInfo()
    pool = xp.get_default_memory_pool()
    arenas = sorted((a.capacity for a in list(_LIVE)), reverse=True)
    gib = 1 << 30
    return (f"device: {free / gib:.2f} GiB free of {total / gib:.2f} GiB; CuPy pool: "
            f"{pool.used_bytes() / gib:.2f} GiB in use, {pool.total_bytes() / gib:.2f} GiB held; "
            f"{len(arenas)} unreleased arena(s) of this process"
            + (f": {', '.join(f'{c / gib:.2f}' for c in arenas[:6])} GiB" if arenas else ""))


def _device_malloc(xp, n: int):
    """``cudaMalloc(n)`` for an arena.  Blocks cached in CuPy's pool and garbage not yet
    collected can hold the memory an arena needs (a process that builds executor after
    executor): on the first failure both are given back and the allocation tried once more;
    on the second, the error says where the device's memory is."""
    try:
        return xp.cuda.Memory(n)
    except xp.cuda.memory.OutOfMemoryError:
        pass
    except xp.cuda.runtime.CUDARuntimeError as e:
        if "MemoryAllocation" not in str(e):
            raise
    import gc
    gc.collect()
    xp.get_default_memory_pool().free_all_blocks()
    try:
        return xp.cuda.Memory(n)
    except (xp.cuda.memory.OutOfMemoryError, xp.cuda.runtime.CUDARuntimeError) as e:
        raise MemoryError(f"cannot allocate the device arena of {n} bytes ({n / (1 << 30):.2f} "
                          f"GiB): {type(e).__name__}: {e}; {device_memory_report(xp)}") from e


class DeviceArena(Arena):
    """The device buffer pool: ``capacity`` bytes of bookkeeping over one flat buffer.

    Args:
        capacity: the budget (bytes); allocations beyond it raise.
        xp: numpy (CPU mode) or cupy (GPU mode).
        backing_bytes: bytes of real memory behind the bookkeeping.  GPU mode always backs the
            whole capacity with one ``cudaMalloc`` (the budget is real).  CPU mode may back only
            what the plan's layout can reach (its extent), since NumPy memory is not the budget
            being modelled; the accounting is identical.
    """

    def __init__(self, capacity: int, xp=np, backing_bytes: int | None = None):
        super().__init__(capacity)
        self.xp = xp
        self.gpu = gpu = xp is not np
        n = self.capacity if (gpu or backing_bytes is None) else min(int(backing_bytes),
                                                                    self.capacity)
        self.backing_bytes = n
        if gpu:
            # One cudaMalloc of the budget, outside CuPy's pool (section 5).  256-byte aligned
            # at least (cudaMalloc), and every region offset is a multiple of ALIGN = 512, so
            # every region keeps the alignment cuBLAS and cuDNN want.
            self._memory = _device_malloc(xp, max(n, 1))
            _LIVE.add(self)
            self.ptr = int(self._memory.ptr)
            self.buffer = xp.ndarray((n,), dtype=np.uint8,
                                     memptr=xp.cuda.MemoryPointer(self._memory, 0))
        else:
            self._memory = None
            self.ptr = 0
            self.buffer = np.empty(n, dtype=np.uint8)

    def release(self):
        """Drop this arena's reference to its memory (the cudaMalloc is freed once no view of
        it is left); for callers that build many executors in one process."""
        self.buffer = None
        self._memory = None
        _LIVE.discard(self)

    def view(self, offset: int, nbytes: int, dtype) -> "np.ndarray":
        """A 1-d array of ``dtype`` over ``[offset, offset + nbytes)`` (no copy).

        GPU: an ndarray of its own over a pointer into the arena (see the module doc: it keeps
        32-bit indexing whatever the arena's size)."""
        dtype = np.dtype(dtype)
        if offset < 0 or offset + nbytes > self.backing_bytes:
            raise ArenaError(f"region [{offset}, {offset + nbytes}) beyond the arena's "
                             f"{self.backing_bytes} backed bytes")
        count = nbytes // dtype.itemsize
        if self.gpu:
            ptr = self.xp.cuda.MemoryPointer(self._memory, offset)
            return self.xp.ndarray((count,), dtype=dtype, memptr=ptr)
        return self.buffer[offset:offset + count * dtype.itemsize].view(dtype)

    def region(self, offset: int, nbytes: int):
        """The bytes ``[offset, offset + nbytes)`` as a uint8 array (copies, poisoning)."""
        return self.view(offset, nbytes, np.uint8)

    def fill(self, offset: int, nbytes: int, byte: int = 0xFF):
        """Overwrite a region (debug poisoning: 0xFF bytes read as NaN or -1).  CPU: at once;
        GPU: use :meth:`fill_async` on the stream that owns the region."""
        if self.gpu:  # pragma: no cover - GPU machine only
            self.fill_async(offset, nbytes, None, byte)
            return
        self.buffer[offset:offset + nbytes] = byte

    def fill_async(self, offset: int, nbytes: int, stream, byte: int = 0xFF):  # pragma: no cover
        """GPU: ``cudaMemsetAsync`` of the region on ``stream`` (None: the current stream)."""
        if offset < 0 or offset + nbytes > self.backing_bytes:
            raise ArenaError(f"region [{offset}, {offset + nbytes}) beyond the arena's "
                             f"{self.backing_bytes} backed bytes")
        cp = self.xp
        s = cp.cuda.get_current_stream() if stream is None else stream
        cp.cuda.runtime.memsetAsync(self.ptr + offset, byte, nbytes, s.ptr)


class HostArena:
    """Host memory for offloaded data, allocated once: pinned in GPU mode, NumPy in CPU mode.

    Regions are fixed offsets chosen by the planner (one per offloaded buffer, see
    ``Plan.host_bytes``), so there is no allocator here.
    """

    def __init__(self, nbytes: int, xp=np):
        self.nbytes = int(nbytes)
        self.pinned = xp is not np
        if self.pinned and self.nbytes:
            # Page-locked: DMA copies at full PCIe speed, asynchronous with respect to the host.
            # One cudaHostAlloc of exactly the size, not CuPy's pinned pool: the pool rounds
            # sizes up to powers of two and keeps freed blocks, so arenas of successive
            # profiling runs (9, 21, 41, 55 GiB for ResNet-50) would pile up as 16+32+64+64
            # GiB of page-locked host memory and exhaust the host (seen on an H200 machine).
            self._mem = xp.cuda.PinnedMemoryPointer(xp.cuda.PinnedMemory(self.nbytes), 0)
            self.buffer = np.frombuffer(self._mem, dtype=np.uint8, count=self.nbytes)
        else:
            self._mem = None
            self.buffer = np.empty(self.nbytes, dtype=np.uint8)

    def release(self):
        """Give the host memory back now (the executor calls this when it closes)."""
        self.buffer = None
        self._mem = None

    def view(self, offset: int, nbytes: int) -> np.ndarray:
        if offset + nbytes > self.nbytes:
            raise ArenaError(f"host region [{offset}, {offset + nbytes}) beyond the host arena's "
                             f"{self.nbytes} bytes")
        return self.buffer[offset:offset + nbytes]


class ScratchReserve:
    """Bookkeeping of the scratch reserve: ``[base, base + capacity)`` of the device arena.

    While an executor runs, every CuPy allocation (layer temporaries, workspaces made through
    CuPy) is served from this region (:class:`swap.runtime.ScratchAllocator`), so that the
    measured arena high-water mark includes it and nothing is allocated outside the budget.
    The layout is the same in CPU mode, where nothing drives it (NumPy temporaries cannot be
    redirected); tests drive it directly, as the GPU allocator does.

    Offsets returned by :meth:`malloc` are relative to ``base``.  ``where`` is set by the
    executor to what is running (a step index, or a label), so that the peak per step and an
    overflow can name the layer.  Thread-safe: CuPy may free from another thread.
    """

    def __init__(self, base: int, capacity: int, alignment: int = ALIGN):
        if base < 0 or capacity < 0:
            raise ValueError(f"scratch reserve needs base, capacity >= 0, got {base}, {capacity}")
        self.base = int(base)
        self.capacity = int(capacity)
        self.arena = Arena(self.capacity, alignment)
        self.where = None
        self.peak_by_where: dict = {}
        self.overflows = 0              # requests that found no room
        self._lock = threading.RLock()

    @property
    def in_use(self) -> int:
        return self.arena.in_use

    @property
    def high_water(self) -> int:
        """Highest reserve byte handed out, relative to ``base``."""
        return self.arena.high_water

    @property
    def peak_in_use(self) -> int:
        return self.arena.peak_in_use

    @property
    def live(self) -> int:
        """Allocations not returned yet."""
        return len(self.arena.live)

    def malloc(self, nbytes: int) -> int | None:
        """Offset (relative to ``base``) of ``nbytes`` (aligned), or None when no block fits."""
        n = align(nbytes, self.arena.alignment)
        if n == 0:
            return None
        with self._lock:
            try:
                off = self.arena.allocate(n)
            except ArenaError:
                self.overflows += 1
                return None
            w = self.where
            if self.arena.in_use > self.peak_by_where.get(w, 0):
                self.peak_by_where[w] = self.arena.in_use
            return off

    def free(self, offset: int) -> int:
        with self._lock:
            return self.arena.free(offset)

    def __repr__(self):
        return (f"<ScratchReserve {self.in_use}/{self.capacity} bytes at {self.base}, "
                f"{self.live} live, high water {self.high_water}>")
