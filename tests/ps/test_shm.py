"""The shared-memory data plane (ps/shm.py, ``--ps-shm``): segments, the protocol's
FLAG_SHM, and real servers and workers on 127.0.0.1 whose values go through
/dev/shm-style files instead of the sockets."""
import os

import numpy as np
import pytest

from ps_helpers import INPUT_NET, logs, write_solver
from ps import protocol as P
from ps.protocol import Op, ProtocolError
from ps.shm import ALIGN, ENV_DIR, Segment, WorkerSegments, check_name, layout

from test_bsp import reference_params, run_ps


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv(ENV_DIR, str(d))
    return d


def test_layout_aligns_every_blob():
    offsets, total = layout([(3,), (2, 5), (0,), (7,)], np.float32)
    assert offsets == [0, ALIGN, 2 * ALIGN, 2 * ALIGN]
    assert total == 3 * ALIGN
    assert layout([], np.float32) == ([], ALIGN)


def test_a_segment_is_shared_between_its_creator_and_a_peer(shm_dir):
    shapes = [(4, 3), (5,)]
    own = Segment.create("g0s1", shapes, np.float32)
    assert own.name.startswith(f"mcps-{os.getpid()}-") and (shm_dir / own.name).exists()
    peer = Segment.attach(own.name, shapes, np.float32)
    own.arrays[0][...] = np.arange(12, dtype=np.float32).reshape(4, 3)
    peer.arrays[1][...] = 7
    np.testing.assert_array_equal(peer.arrays[0], own.arrays[0])
    assert (own.arrays[1] == 7).all() and own.arrays[1].shape == (5,)
    own.unlink()                          # the name goes, the mappings stay
    assert list(shm_dir.iterdir()) == []
    peer.arrays[0][0, 0] = -1
    assert own.arrays[0][0, 0] == -1
    kept = own.arrays[0]
    own.close()                           # a view still held: no error
    peer.close()
    assert kept[0, 0] == -1


def test_attach_checks_the_name_and_the_size(shm_dir):
    for bad in ("../etc/passwd", "mcps-1-ab-p0/../x", "other", "mcps-x-ab-p0"):
        with pytest.raises(ValueError, match="not a parameter-server shared-memory"):
            check_name(bad)
    with pytest.raises(FileNotFoundError, match="one host"):
        Segment.attach("mcps-1-ab-p0", [(4,)], np.float32)
    seg = Segment.create("p0", [(4,)], np.float32)
    with pytest.raises(ValueError, match="the peers disagree on the blobs"):
        Segment.attach(seg.name, [(4096,)], np.float32)
    seg.close()
    assert list(shm_dir.iterdir()) == []


def test_a_full_segment_directory_is_an_error_not_a_crash(shm_dir, monkeypatch):
    """The pages are reserved at creation (posix_fallocate): a tmpfs without room raises,
    naming the directory, and leaves no file behind (touching a missing page later would
    kill the process with SIGBUS)."""
    import errno

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=f"no room for 4,096 bytes in {shm_dir}"):
        Segment.create("p0", [(1024,)], np.float32)
    assert list(shm_dir.iterdir()) == []


def test_flag_shm_frames_carry_headers_only(shm_dir):
    ws = WorkerSegments(0, [[0, 2], [1]], [(2, 3), (4,), (5,)], np.float32)
    g = ws.grad(2)
    g[...] = 1.5
    frames = P.encode(Op.PUSH, 4, 0, 0, [(0, P.InShm(ws.grad(0))), (2, P.InShm(g))])
    assert [len(memoryview(f)) for f in frames[1::2]] == [0, 0]
    with pytest.raises(ProtocolError, match="none is mapped for this peer"):
        P.decode(frames)
    server_side = Segment.attach(ws.name(0), [(2, 3), (5,)], np.float32)
    where = {0: 0, 2: 1}
    msg = P.decode(frames, placed=lambda r, s, b, dt, shape: server_side.arrays[where[b]])
    assert [p.blob_id for p in msg.payloads] == [0, 2]
    np.testing.assert_array_equal(msg.payloads[1].array, np.full(5, 1.5, np.float32))
    # the worker's side: answers of a shard whose segment it has not mapped are refused
    with pytest.raises(ProtocolError, match="before naming its segment"):
        ws.placed(0, 0, 0, np.dtype(np.float32), (2, 3))
    params = Segment.create("p1", [(4,)], np.float32)
    ws.attach(1, params.name)
    with pytest.raises(ProtocolError, match="blob 0 is not on shard 1"):
        ws.placed(0, 1, 0, np.dtype(np.float32), (2, 3))
    with pytest.raises(ProtocolError, match="the segment holds float32"):
        ws.placed(0, 1, 1, np.dtype(np.float32), (2, 2))
    assert ws.placed(0, 1, 1, np.dtype(np.float32), (4,)).shape == (4,)
    server_side.close()
    params.close()
    ws.close()
    assert list(shm_dir.iterdir()) == []


@pytest.mark.parametrize("extra", [[], ["--no-overlap"]])
def test_shared_memory_trains_bit_for_bit_as_the_sockets(procs, tmp_path, shm_dir, extra):
    """W = 2 workers, 3 shards: the same sums in the same order, so the same parameters as
    through the sockets, and every segment's name gone at the end."""
    plain, _, _ = run_ps(procs, tmp_path, "plain", 4, 2, 3, extra=extra)
    got, workers, servers = run_ps(procs, tmp_path, "shm", 4, 2, 3, extra=["--shm", *extra])
    for a, b in zip(got, plain):
        np.testing.assert_array_equal(a, b)
    ref = reference_params(write_solver(tmp_path, "ref", INPUT_NET, k=8))
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert "shared memory: parameters in" in servers[0].log()
    assert list(shm_dir.iterdir()) == []


def test_one_worker_with_shared_memory_and_one_without_are_refused(procs, tmp_path, shm_dir):
    solver = write_solver(tmp_path, "mix", INPUT_NET, k=4)
    srv = procs.server(0, 2, timeout=5, name="mix_shard0")
    w = [procs.worker_api(f"mix_w{r}", solver, [srv.endpoint], r, 2, tmp_path / f"m{r}.npz", 5,
                          extra=["--shm"] if r == 0 else [])
         for r in range(2)]
    assert procs.wait_all(w + [srv], 30) == [1, 1, 1], logs(*w, srv)
    msg = "rank(s) 0 use shared memory (--ps-shm), rank(s) 1 do not"
    assert msg in srv.log() and msg in w[0].log() and msg in w[1].log()
    assert list(shm_dir.iterdir()) == []


def test_shared_memory_refuses_link_emulation():
    from ps.worker import PSConfig
    with pytest.raises(ValueError, match="link emulation cannot delay"):
        PSConfig(endpoints=["tcp://127.0.0.1:9"], shm=True, link_gbps=10.0).validate()
