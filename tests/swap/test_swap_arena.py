"""swap.arena: the offset allocator, the device and host arenas."""
import numpy as np
import pytest

from swap.arena import ALIGN, Arena, ArenaError, DeviceArena, HostArena, align


def test_align_rounds_up_to_the_arena_alignment():
    assert align(0) == 0
    assert align(1) == ALIGN
    assert align(ALIGN) == ALIGN
    assert align(ALIGN + 1) == 2 * ALIGN


def test_best_fit_takes_the_smallest_hole_and_the_end_last():
    a = Arena(10 * ALIGN)
    offs = [a.allocate(ALIGN) for _ in range(6)]          # 0..5
    a.free(offs[1])                                        # hole of 1 at 1
    a.free(offs[3])
    a.free(offs[4])                                        # hole of 2 at 3
    assert a.allocate(ALIGN) == offs[1]                    # smallest hole that fits
    assert a.allocate(2 * ALIGN) == offs[3]
    assert a.allocate(ALIGN) == 6 * ALIGN                  # no hole left: the end
    assert a.high_water == 7 * ALIGN


def test_free_coalesces_neighbours_and_accounting_holds():
    a = Arena(8 * ALIGN)
    x, y, z = (a.allocate(2 * ALIGN) for _ in range(3))
    assert a.in_use == 6 * ALIGN
    a.free(x)
    a.free(z)
    a.free(y)
    assert a.free_blocks() == [(0, 8 * ALIGN)]
    assert a.in_use == 0 and a.peak_in_use == 6 * ALIGN


def test_explicit_offsets_are_checked():
    a = Arena(4 * ALIGN)
    assert a.allocate(ALIGN, offset=2 * ALIGN) == 2 * ALIGN
    with pytest.raises(ArenaError, match="not free"):
        a.allocate(2 * ALIGN, offset=ALIGN)               # overlaps the live region
    with pytest.raises(ArenaError, match="not free"):
        a.allocate(2 * ALIGN, offset=3 * ALIGN)           # passes the end
    with pytest.raises(ArenaError, match="no free block"):
        a.allocate(3 * ALIGN)
    with pytest.raises(ArenaError, match="holds no allocation"):
        a.free(ALIGN)


def test_layout_does_not_depend_on_capacity():
    rng = np.random.default_rng(0)
    seq = []
    live = []
    for _ in range(200):
        if live and rng.random() < 0.45:
            seq.append(("free", live.pop(int(rng.integers(len(live))))))
        else:
            seq.append(("alloc", int(rng.integers(1, 8)) * ALIGN))
            live.append(len(seq) - 1)

    def replay(capacity):
        a = Arena(capacity)
        where, out = {}, []
        for i, (kind, v) in enumerate(seq):
            if kind == "alloc":
                where[i] = a.allocate(v)
                out.append(where[i])
            else:
                a.free(where.pop(v))
        return out, a.high_water

    big, hw = replay(1 << 30)
    same, _ = replay(hw)
    assert same == big
    with pytest.raises(ArenaError):
        replay(hw - ALIGN)


def test_device_arena_views_are_typed_windows_of_one_buffer():
    d = DeviceArena(4 * ALIGN, np)
    assert d.buffer.nbytes == 4 * ALIGN
    off = d.allocate(16)
    v = d.view(off, 16, np.float32)
    assert v.shape == (4,) and v.dtype == np.float32
    v[:] = [1, 2, 3, 4]
    assert np.array_equal(d.view(off, 16, np.float32), [1, 2, 3, 4])
    d.fill(off, 16)
    assert np.isnan(v).all()
    assert DeviceArena(1 << 40, np, backing_bytes=ALIGN).buffer.nbytes == ALIGN  # CPU stand-in
    with pytest.raises(ArenaError):
        DeviceArena(1 << 40, np, backing_bytes=ALIGN).view(ALIGN, 4, np.float32)


def test_host_arena_regions():
    h = HostArena(3 * ALIGN)
    assert not h.pinned
    assert h.view(ALIGN, ALIGN).nbytes == ALIGN
    with pytest.raises(ArenaError):
        h.view(2 * ALIGN, 2 * ALIGN)
