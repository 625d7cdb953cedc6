"""The wire format, the shard assignment and the link model (no processes)."""
import numpy as np
import pytest

from ps import protocol as P
from ps.protocol import Op, ProtocolError
from ps.sharding import assign_shards, shard_bytes
from ps.transport import LinkModel


ARRAYS = [np.arange(12, dtype=np.float32).reshape(3, 4),
          np.linspace(0, 1, 5),                                  # float64
          np.ones((2, 1, 3), dtype=np.float16),
          np.frombuffer(b"text", dtype=np.uint8),
          np.array([-128, 0, 127], dtype=np.int8),
          np.array(7, dtype=np.int64),                           # 0-d
          np.zeros((0, 3), dtype=np.float32),                    # empty
          np.zeros((1,) * 8, dtype=np.float32)]                  # MAX_NDIM


def test_roundtrip_keeps_values_dtypes_and_shapes():
    frames = P.encode(Op.PUSH, 41, 2, 1, list(enumerate(ARRAYS)))
    wire = [bytes(f) for f in frames]                 # what the other side receives
    msg = P.decode(wire)
    assert (msg.op, msg.iteration, msg.rank, msg.shard) == (Op.PUSH, 41, 2, 1)
    assert [p.blob_id for p in msg.payloads] == list(range(len(ARRAYS)))
    for p, a in zip(msg.payloads, ARRAYS):
        assert p.array.dtype == a.dtype and p.array.shape == a.shape
        np.testing.assert_array_equal(p.array, a)


def test_buffers_are_neither_copied_on_send_nor_on_receive():
    a = np.arange(1000, dtype=np.float32)
    frames = P.encode(Op.PARAMS, 0, 0, 0, [(3, a)])
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.float32), a)
    received = [frames[0], bytearray(frames[1])]
    msg = P.decode(received)
    assert np.shares_memory(msg.payloads[0].array, np.frombuffer(received[1], dtype=np.float32))


def test_header_is_a_fixed_struct():
    h = P.pack_header(Op.PUSH, 5, 1, 0, 9, np.zeros((2, 3), np.float32))
    assert len(h) == P.HEADER.size == 104
    magic, version, op, it, rank, shard, blob, code, ndim, flags, *rest = P.HEADER.unpack(h)
    assert (magic, version, op, it, rank, shard, blob, code, ndim, flags) == (
        b"MCPS", P.PROTOCOL_VERSION, Op.PUSH, 5, 1, 0, 9, P.DType.FLOAT32, 2, 0)
    assert rest[:3] == [2, 3, 0] and rest[-1] == 24


def test_text_messages():
    msg = P.decode(P.encode_text(Op.ABORT, 3, 1, 0, "rank 1 lost ü"))
    assert msg.op == Op.ABORT and msg.text() == "rank 1 lost ü"
    empty = P.decode(P.encode(Op.HELLO, 0, 1, -1))
    assert empty.payloads[0].blob_id == -1 and empty.payloads[0].array.size == 0


def test_encode_refuses_what_it_cannot_describe():
    with pytest.raises(ProtocolError, match="C-contiguous"):
        P.encode(Op.PUSH, 0, 0, 0, [(0, np.zeros((4, 4), np.float32)[:, ::2])])
    with pytest.raises(ProtocolError, match="at most 8"):
        P.encode(Op.PUSH, 0, 0, 0, [(0, np.zeros((1,) * 9, np.float32))])
    with pytest.raises(ProtocolError, match="cannot be sent"):
        P.encode(Op.PUSH, 0, 0, 0, [(0, np.zeros(2, np.complex64))])


def test_decode_limits_pairs_and_frame_size():
    frames = P.encode(Op.PUSH, 0, 0, 0, [(i, np.zeros(1, np.float32)) for i in range(5)])
    with pytest.raises(ProtocolError, match="at most 4"):
        P.decode(frames, max_pairs=4)
    with pytest.raises(ProtocolError, match="exceeds the maximum of 3 bytes"):
        P.decode(frames, max_frame_bytes=3)
    with pytest.raises(ProtocolError, match="empty message"):
        P.decode([])


# ------------------------------------------------------------------ sharding
def test_shards_partition_the_blobs_and_balance_bytes():
    sizes = [100, 60, 50, 40, 10]
    shards = assign_shards(sizes, 2)
    assert sorted(i for s in shards for i in s) == list(range(5))
    assert shards == [[0, 3], [1, 2, 4]]              # greedy, largest first
    loads = shard_bytes(sizes, shards)
    assert max(loads) - min(loads) <= max(sizes)
    assert assign_shards(sizes, 2) == shards          # every worker computes the same
    assert assign_shards([8, 8], 4) == [[0], [1], [], []]
    with pytest.raises(ValueError):
        assign_shards(sizes, 0)


def test_resnet_like_sizes_balance_well():
    rng = np.random.default_rng(0)
    sizes = [int(x) for x in rng.choice([256, 4096, 65536, 589824, 2359296, 8192000], 470)]
    loads = shard_bytes(sizes, assign_shards(sizes, 8))
    assert max(loads) / (sum(sizes) / 8) < 1.02


# ---------------------------------------------------------------- link model
class FakeClock:
    def __init__(self):
        self.t = 100.0
        self.slept = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.slept.append(s)
        self.t += s


def test_link_model_queues_on_a_link_and_runs_links_in_parallel():
    clock = FakeClock()
    link = LinkModel(gbps=8.0, latency_ms=0.5, clock=clock, sleep=clock.sleep)  # 1e9 bytes/s
    due = link.schedule([("a", 1_000_000), ("a", 1_000_000), ("b", 1_000_000)])
    assert due == pytest.approx([100.0015, 100.0025, 100.0015])
    assert link.busy_time(125_000_000) == pytest.approx(0.125)   # 1 Gbit at 8 Gb/s


def test_link_model_sends_each_message_at_its_arrival_time():
    clock = FakeClock()
    link = LinkModel(gbps=8.0, latency_ms=1.0, clock=clock, sleep=clock.sleep)

    class Sock:
        sent = []

        def send_multipart(self, frames, flags=0, copy=True):
            Sock.sent.append((clock.t, len(frames)))

    big = P.encode(Op.PUSH, 0, 0, 0, [(0, np.zeros(250_000, np.float32))])   # ~1 MB
    small = P.encode(Op.PUSH, 0, 0, 1, [(1, np.zeros(1, np.float32))])
    link.send_all([("s0", Sock(), big, None), ("s1", Sock(), small, None)])
    (t_small, _), (t_big, _) = Sock.sent          # the small message, on its own link, goes first
    assert t_small == pytest.approx(100.001, abs=1e-6)
    assert t_big == pytest.approx(100.0 + 0.001 + P.frames_nbytes(big) / 1e9, abs=1e-6)
    assert not LinkModel().enabled
    with pytest.raises(ValueError):
        LinkModel(latency_ms=-1)


def test_send_all_reads_the_clock_once_before_it_sleeps():
    """A clock that moves between two reads must not give sleep() a negative length (a
    ps_scaling test failed once with "sleep length must be non-negative")."""
    clock = FakeClock()
    slept = []

    def ticking():                    # each read is 0.6 ms later: the message is due in 1 ms
        clock.t += 0.0006
        return clock.t

    def sleep(s):
        if s < 0:
            raise ValueError("sleep length must be non-negative")
        slept.append(s)
        clock.t += s
    link = LinkModel(gbps=8.0, latency_ms=1.0, clock=ticking, sleep=sleep)

    class Sock:
        def send_multipart(self, frames, flags=0, copy=True):
            pass
    small = P.encode(Op.PUSH, 0, 0, 1, [(1, np.zeros(1, np.float32))])
    for _ in range(3):
        link.send_all([("s1", Sock(), small, None)])
    assert all(s > 0 for s in slept)


@pytest.mark.parametrize("gbps", [None, 8.0])
def test_send_all_tries_every_message_and_names_each_link_that_failed(gbps):
    import zmq
    from ps.transport import SendFailed
    clock = FakeClock()
    link = LinkModel(gbps=gbps, clock=clock, sleep=clock.sleep)
    sent = []

    class Sock:
        def __init__(self, name, error=None):
            self.name, self.error = name, error

        def send_multipart(self, frames, flags=0, copy=True):
            if self.error is not None:
                raise self.error
            sent.append(self.name)

    msg = P.encode(Op.PARAMS, 3, 0, 0, [(0, np.zeros(4, np.float32))])
    gone = zmq.ZMQError(zmq.EHOSTUNREACH)
    with pytest.raises(SendFailed) as info:
        link.send_all([(("reply", 0), Sock("r0"), msg, b"a"),
                       (("reply", 1), Sock("r1", gone), msg, b"b"),
                       (("reply", 2), Sock("r2"), msg, b"c"),
                       (("reply", 3), Sock("r3", zmq.Again()), msg, b"d")])
    assert sorted(sent) == ["r0", "r2"]                 # the failures stopped nobody
    assert info.value.keys == [("reply", 1), ("reply", 3)]
    assert info.value.errno == zmq.EHOSTUNREACH
    assert "('reply', 1)" in str(info.value) and "('reply', 3)" in str(info.value)
