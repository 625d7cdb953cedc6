"""Hostile and broken peers: malformed and oversized frames, CURVE authentication.

A server must log why it refused a message, answer its sender, stay alive
and go on serving well-behaved workers.
"""
import pytest
import zmq

from ps_helpers import INPUT_NET, logs, write_solver
from ps import protocol as P
from ps.protocol import HEADER, MAGIC, PROTOCOL_VERSION, Op


def header(op=Op.PUSH, iteration=0, rank=0, shard=0, blob=0, dtype=1, ndim=1, shape=(4,),
           nbytes=16, magic=MAGIC, version=PROTOCOL_VERSION, flags=0):
    dims = list(shape) + [0] * (P.MAX_NDIM - len(shape))
    return HEADER.pack(magic, version, int(op), iteration, rank, shard, blob, dtype, ndim, flags,
                       *dims, nbytes)


BAD = [
    ([b"garbage"], "a message is header/buffer pairs"),
    ([b"short", b""], "header of 5 bytes, expected 104"),
    ([header(magic=b"HTTP"), bytes(16)], "bad magic"),
    ([header(version=99), bytes(16)], "protocol version 99"),
    ([header(op=77), bytes(16)], "unknown op 77"),
    ([header(dtype=42), bytes(16)], "unknown dtype code 42"),
    ([header(ndim=9), bytes(16)], "ndim 9"),
    ([header(nbytes=12), bytes(12)], "does not match shape"),
    ([header(), bytes(15)], "buffer of 15 bytes, the header says 16"),
    ([header(shape=(4096,), nbytes=16384), bytes(16384)], "exceeds the maximum of 8192 bytes"),
    ([header(), bytes(16), header(iteration=3), bytes(16)], "differs from the message's first"),
    ([header(rank=5), bytes(16)], "rank 5 out of range"),
    ([header(flags=2), bytes(16)], "unknown flags 0x2"),
    ([header(flags=P.FLAG_SHM), b""], "none is mapped for this peer"),
    ([header(flags=P.FLAG_SHM), bytes(16)], "the frame must be empty"),
    ([header(shard=3), bytes(16)], "message for shard 3 reached shard 0"),
    ([header(), bytes(16)], "PUSH before every rank has joined"),
    ([header(op=Op.INIT, dtype=4, shape=(3,), nbytes=3, blob=-1), b"abc"],
     "solver parameters do not parse"),
]


def raw_dealer(ctx, endpoint, **curve):
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    for k, v in curve.items():
        setattr(d, k, v)
    d.connect(endpoint)
    return d


def test_malformed_and_oversized_frames_are_rejected_and_the_server_serves_on(procs, tmp_path):
    srv = procs.server(0, 1, timeout=10, extra=["--max-message-bytes", "8192"])
    ctx = zmq.Context()
    try:
        d = raw_dealer(ctx, srv.endpoint)
        for frames, reason in BAD:
            d.send_multipart(frames)
            assert d.poll(5000), f"no answer to a message that should fail with {reason!r}"
            msg = P.decode(d.recv_multipart())
            assert msg.op == Op.ERROR and reason in msg.text(), (reason, msg.text())
            assert srv.popen.poll() is None, srv.log()
        d.close()
    finally:
        ctx.term()
    log = srv.log()
    assert log.count("rejected a message") == len(BAD), log
    # still alive, and a proper worker trains through it
    solver = write_solver(tmp_path, "ok", INPUT_NET, k=4, max_iter=3)
    w = procs.worker_api("ok_w0", solver, [srv.endpoint], 0, 1, tmp_path / "ok.npz", 10)
    assert procs.wait_all([w, srv], 30) == [0, 0], logs(w, srv)


def test_a_worker_with_a_different_net_is_refused(procs, tmp_path):
    """Ranks must agree on blobs and solver: the join fails naming the rank."""
    a = write_solver(tmp_path, "a", INPUT_NET, k=4)
    b = write_solver(tmp_path, "b", INPUT_NET.replace("num_output: 6", "num_output: 5"), k=4)
    srv = procs.server(0, 2, timeout=10)
    w0 = procs.worker_api("w0", a, [srv.endpoint], 0, 2, tmp_path / "0.npz", 10)
    w1 = procs.worker_api("w1", b, [srv.endpoint], 1, 2, tmp_path / "1.npz", 10)
    assert procs.wait_all([w0, w1, srv], 30) == [1, 1, 1]
    assert "rank 1: blob 0 is float32[5, 4], rank 0's is float32[6, 4]" in w0.log(), logs(w0, srv)


@pytest.fixture
def keys(tmp_path):
    from ps.transport import create_keys
    good = tmp_path / "keys"
    create_keys(str(good))
    # an outsider: a valid key pair that the server never authorized, and the server's public key
    bad = tmp_path / "outsider"
    create_keys(str(bad))
    (bad / "server.key").write_bytes((good / "server.key").read_bytes())
    return good, bad


def test_curve_admits_authorized_clients_only(procs, tmp_path, keys):
    import zmq.auth
    good, bad = keys
    srv = procs.server(0, 1, timeout=10, extra=["--curve-dir", str(good)])
    server_public, _ = zmq.auth.load_certificate(str(good / "server.key"))
    outsider_public, outsider_secret = zmq.auth.load_certificate(str(bad / "client.key_secret"))
    probe = P.encode_text(Op.INIT, 0, 0, 0, "hello")
    ctx = zmq.Context()
    try:
        plain = raw_dealer(ctx, srv.endpoint)               # no CURVE at all
        outsider = raw_dealer(ctx, srv.endpoint, curve_serverkey=server_public,
                              curve_publickey=outsider_public, curve_secretkey=outsider_secret)
        for d in (plain, outsider):
            d.send_multipart(probe, copy=True)
        for d in (plain, outsider):
            assert not d.poll(1000), "an unauthenticated client got an answer"
            d.close()
    finally:
        ctx.term()
    assert "rejected" not in srv.log()   # nothing reached the application
    assert "CURVE: refused a client" in srv.log()
    # a worker holding an unauthorized key is told so, quickly
    solver = write_solver(tmp_path, "c", INPUT_NET, k=4, max_iter=3)
    w = procs.worker_api("outsider", solver, [srv.endpoint], 0, 1, tmp_path / "o.npz", 10,
                         extra=["--curve-dir", str(bad)])
    assert procs.wait_all([w], 15) == [1]
    assert "refused the connection handshake" in w.log(), w.log()
    # the authorized worker trains
    w = procs.worker_api("insider", solver, [srv.endpoint], 0, 1, tmp_path / "i.npz", 10,
                         extra=["--curve-dir", str(good)])
    assert procs.wait_all([w, srv], 30) == [0, 0], logs(w, srv)


def test_pushes_that_are_not_a_declared_bucket_are_rejected(procs, tmp_path):
    """A worker declares two buckets at INIT; the shard answers each bucket's PUSH with that
    bucket's PARAMS, and refuses a bucket table that does not number its buckets 0..B-1, a
    PUSH mixing buckets, and a bucket pushed twice in one round."""
    import numpy as np
    srv = procs.server(0, 1, timeout=10)
    from minicaffe.proto import caffe_pb2
    sp = caffe_pb2.SolverParameter(base_lr=0.5, lr_policy="fixed", max_iter=1,
                                   snapshot_after_train=False,
                                   snapshot_prefix=str(tmp_path / "b"))
    solver = np.frombuffer(sp.SerializeToString(), np.uint8)     # one round
    w0, w1 = np.arange(4, dtype=np.float32), np.arange(3, dtype=np.float32)
    spec = np.array([1.0, 1.0])

    def init(table):
        return P.encode(Op.INIT, 0, 0, 0, [(-1, solver), (-2, np.array(table, np.int64)),
                                           (0, w0), (0, spec), (1, w1), (1, spec)])

    ctx = zmq.Context()
    d = raw_dealer(ctx, srv.endpoint)
    try:
        def answer():
            assert d.poll(5000), srv.log()
            return P.decode(d.recv_multipart())

        for frames, reason in [(init([0, 2]), "buckets [0, 2] must be numbered 0..B-1"),
                               (init([0]), "one entry per blob (2)")]:
            d.send_multipart(frames)
            msg = answer()
            assert msg.op == Op.ERROR and reason in msg.text(), msg.text()
        d.send_multipart(init([1, 0]))                  # blob 1 is bucket 0, blob 0 bucket 1
        msg = answer()
        assert msg.op == Op.PARAMS and [p.blob_id for p in msg.payloads] == [0, 1]
        for payloads, reason in [([(0, w0), (1, w1)], "not one of shard 0's 2 buckets"),
                                 ([(1, w1)], None),
                                 ([(1, w1)], "pushed bucket 0 of iteration 0 twice")]:
            d.send_multipart(P.encode(Op.PUSH, 0, 0, 0, payloads))
            msg = answer()
            if reason is None:                          # bucket 0 is complete: its answer
                assert msg.op == Op.PARAMS and msg.iteration == 1
                assert [p.blob_id for p in msg.payloads] == [1]
                np.testing.assert_array_equal(msg.payloads[0].array, w1 - 0.5 * w1)
            else:
                assert msg.op == Op.ERROR and reason in msg.text(), msg.text()
        d.send_multipart(P.encode(Op.PUSH, 0, 0, 0, [(0, w0)]))
        msg = answer()
        assert msg.op == Op.PARAMS and [p.blob_id for p in msg.payloads] == [0]
    finally:
        d.close(linger=0)
        ctx.term()
    assert procs.wait_all([srv], 30) == [0], srv.log()
