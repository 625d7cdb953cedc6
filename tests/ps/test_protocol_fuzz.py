"""A seeded robustness fuzz of one shard against bad or hostile clients.

Each scenario starts a shard in-process (``ShardServer.run`` on a thread, so an uncaught
exception is caught here instead of printing a traceback), joins W well-formed workers
(raw DEALERs speaking ``ps.protocol``) and runs two BSP rounds of SGD with momentum and
weight decay, one or two buckets.  From the scenario's seed, bad messages are mixed in:
truncated or extra frames, a wrong protocol version, a wrong shard index, a rank out of range,
a rank joining twice from another connection, a gradient for an unknown blob or of the wrong
dtype, shape or byte count, a push for a past or future iteration, a push before the join,
a duplicate push, an unexpected op, a frame over the limit (answered) or over twice the limit
(libzmq drops the peer), a hostile solver; at most one fatal fault ends a round: an ABORT, a
worker vanishing mid-round.

Checked for each: the bad sender is answered ERROR naming what was wrong (or, for a fatal
fault, every other rank gets ABORT naming the rank, within the shard's timeout); the shard
never raises; the parameters the good workers receive equal a NumPy reference of the update
from the good gradients only; nothing hangs.
"""
import threading
import time

import numpy as np
import pytest
import zmq

from minicaffe.proto import caffe_pb2
from ps import protocol as P
from ps.protocol import HEADER, Op
from ps.server import ServerConfig, ShardServer

SEED = 20261201
N_SCENARIOS = 64
ROUNDS = 2
MAX_FRAME = 4096                 # --max-message-bytes of every fuzzed shard
TIMEOUT = 4.0                    # the shard's timeout when no fault needs it to expire
FATAL_TIMEOUT = 1.0              # ... when a worker vanishes (the round must time out)
SLACK = 2.0                      # what a good worker may wait beyond the shard's timeout

SHAPES = [(3, 4), (4,)]          # blob 0 (a weight), blob 1 (a bias)
LR_MULT, DECAY_MULT = [1.0, 2.0], [1.0, 0.0]
BASE_LR, MOMENTUM, DECAY = 0.1, 0.9, 0.01

# Faults that leave the round intact: (name, where it may happen)
BENIGN = ["truncated", "short_buffer", "extra_frame", "extra_pair", "version", "shard",
          "rank_range", "unknown_blob", "dtype", "shape", "nbytes", "past", "future",
          "duplicate", "oversized", "huge", "impostor", "wrong_op", "flags", "join_twice"]
JOIN_ONLY = ["push_before_join", "bad_init"]
FATAL = ["abort", "vanish"]
# Faults sent before the join completes (from the rank's own connection, before its INIT,
# or from a stranger): the decoding faults keep their reason, the others are early PUSHes.
JOIN_FRAMES = ["truncated", "short_buffer", "extra_frame", "version", "shard", "rank_range",
               "nbytes", "oversized", "huge", "flags", "unknown_blob", "dtype", "shape",
               "extra_pair", "past", "future"]
EARLY = {"unknown_blob", "dtype", "shape", "extra_pair", "past", "future"}


# ----------------------------------------------------------------- the shard
class Shard:
    """A ShardServer on a thread; ``rc`` its exit status, ``error`` what it raised."""

    def __init__(self, world_size, timeout):
        self.server = ShardServer(ServerConfig(world_size=world_size, timeout=timeout,
                                               max_frame_bytes=MAX_FRAME, verbose=False))
        self.endpoint = self.server.open()
        self.rc = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.rc = self.server.run()
        except BaseException as e:       # a crash: the fuzz's main finding
            self.error = e

    def finish(self, timeout):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the shard is still running"
        assert self.error is None, f"the shard raised {self.error!r}"
        return self.rc


def solver_bytes(**over):
    sp = caffe_pb2.SolverParameter(base_lr=BASE_LR, lr_policy="fixed", momentum=MOMENTUM,
                                   weight_decay=DECAY, max_iter=ROUNDS,
                                   snapshot_after_train=False)
    for k, v in over.items():
        setattr(sp, k, v)
    return np.frombuffer(sp.SerializeToString(), np.uint8)


def init_frames(rank, w, buckets, solver=None, table=None):
    payloads = [(-1, solver_bytes() if solver is None else solver)]
    if buckets == 2 or table is not None:
        payloads.append((-2, np.array([0, 1] if table is None else table, np.int64)))
    for b, a in enumerate(w):
        payloads += [(b, a), (b, np.array([LR_MULT[b], DECAY_MULT[b]]))]
    return P.encode(Op.INIT, 0, rank, 0, payloads)


def wire(frames):
    return [bytes(f) for f in frames]


def with_header(frame, **fields):
    """A header frame with some fields replaced."""
    names = ["magic", "version", "op", "iteration", "rank", "shard", "blob", "dtype", "ndim",
             "flags"]
    vals = list(HEADER.unpack(frame))
    for k, v in fields.items():
        vals[names.index(k)] = v
    return HEADER.pack(*vals)


# ------------------------------------------------------------ the reference
class Reference:
    """Caffe's SGD (momentum, L2 decay, lr/decay multipliers) on the good gradients."""

    def __init__(self, w):
        self.w = [a.copy() for a in w]
        self.v = [np.zeros_like(a) for a in w]

    def update(self, blobs, grads):
        """``grads[r][k]``: rank r's gradient of blob k; only ``blobs`` move."""
        W = len(grads)
        for k in blobs:
            g = grads[0][k].copy()
            for r in range(1, W):
                g += grads[r][k]
            g *= np.float32(1.0 / W)
            g += np.float32(DECAY * DECAY_MULT[k]) * self.w[k]
            self.v[k] = np.float32(MOMENTUM) * self.v[k] + np.float32(BASE_LR * LR_MULT[k]) * g
            self.w[k] = self.w[k] - self.v[k]


# ---------------------------------------------------------------- scenario
class Scenario:
    def __init__(self, index):
        rng = np.random.default_rng([SEED, index])
        self.rng = rng
        self.W = int(rng.integers(1, 4))
        self.nb = int(rng.integers(1, 3))
        self.bucket_blobs = [[0, 1]] if self.nb == 1 else [[0], [1]]
        kinds = list(BENIGN)
        self.join_faults = []          # [(fault, rank)]
        self.round_faults = {t: [] for t in range(ROUNDS)}
        for _ in range(int(rng.integers(0, 3))):
            self.join_faults.append((str(rng.choice(JOIN_ONLY + JOIN_FRAMES)),
                                     int(rng.integers(self.W))))
        for _ in range(int(rng.integers(1, 4))):
            t = int(rng.integers(ROUNDS))
            self.round_faults[t].append((str(rng.choice(kinds)), int(rng.integers(self.W))))
        self.fatal = None              # (fault, rank, round)
        self.hostile_solver = None
        if self.W > 1 and rng.random() < 0.3:
            self.fatal = (str(rng.choice(FATAL)), int(rng.integers(self.W)),
                          int(rng.integers(ROUNDS)))
        elif rng.random() < 0.08:
            self.hostile_solver = str(rng.choice(["type", "lr_policy"]))
        self.timeout = FATAL_TIMEOUT if self.fatal else TIMEOUT

    def describe(self):
        return (f"W={self.W} buckets={self.nb} join={self.join_faults} "
                f"rounds={self.round_faults} fatal={self.fatal} solver={self.hostile_solver}")


def bad_message(kind, rank, t, W, bucket, grads, rng):
    """(frames, expected reason or None for "no answer", from own connection?)."""
    good = wire(P.encode(Op.PUSH, t, rank, 0, [(b, grads[b]) for b in bucket]))
    g0 = grads[bucket[0]]
    if kind == "truncated":
        return good[:-1], "a message is header/buffer pairs", True
    if kind == "short_buffer":
        return good[:-1] + [good[-1][:-4]], f"buffer of {len(good[-1]) - 4} bytes", True
    if kind == "extra_frame":
        return good + [b"junk"], "a message is header/buffer pairs", True
    if kind == "extra_pair":
        extra = wire(P.encode(Op.PUSH, t, rank, 0, [(7, np.zeros(2, np.float32))]))
        return good + extra, "PUSH carries blobs", True
    if kind == "version":
        return [with_header(good[0], version=P.PROTOCOL_VERSION + 1)] + good[1:], \
            f"protocol version {P.PROTOCOL_VERSION + 1}", True
    if kind == "shard":
        frames = wire(P.encode(Op.PUSH, t, rank, 2, [(b, grads[b]) for b in bucket]))
        return frames, "message for shard 2 reached shard 0", True
    if kind == "rank_range":
        r = int(rng.choice([W, W + 5, -1]))
        frames = wire(P.encode(Op.PUSH, t, r, 0, [(b, grads[b]) for b in bucket]))
        return frames, f"rank {r} out of range for world size {W}", False
    if kind == "unknown_blob":
        frames = wire(P.encode(Op.PUSH, t, rank, 0, [(9, g0)]))
        return frames, "PUSH carries blobs [9]", True
    if kind == "dtype":
        frames = wire(P.encode(Op.PUSH, t, rank, 0, [(b, grads[b].astype(np.float64) + 1e6)
                                                       for b in bucket]))
        return frames, f"blob {bucket[0]}: gradient float64", True
    if kind == "shape":
        frames = wire(P.encode(Op.PUSH, t, rank, 0,
                               [(b, (grads[b] + 1e6).reshape(-1)[::-1].copy().reshape(
                                   (-1, 2) if grads[b].size % 2 == 0 else (-1,)))
                                for b in bucket]))
        return frames, f"blob {bucket[0]}: gradient float32", True
    if kind == "nbytes":
        h = HEADER.unpack(good[0])
        return [good[0][:-8] + (h[-1] + 4).to_bytes(8, "little")] + good[1:], \
            "does not match shape", True
    if kind in ("past", "future"):
        it = t - 1 if kind == "past" else t + 1
        frames = wire(P.encode(Op.PUSH, it, rank, 0, [(b, grads[b] + 1e6) for b in bucket]))
        return frames, f"PUSH for iteration {it}, shard 0 is at {t}", True
    if kind == "oversized":
        big = np.zeros(MAX_FRAME // 4 + 16, np.float32)
        frames = wire(P.encode(Op.PUSH, t, rank, 0, [(bucket[0], big)]))
        return frames, f"exceeds the maximum of {MAX_FRAME} bytes", rank % 2 == 0
    if kind == "huge":          # above libzmq's MAXMSGSIZE: the peer is dropped unanswered
        big = np.zeros(MAX_FRAME, np.float32)
        return wire(P.encode(Op.PUSH, t, rank, 0, [(bucket[0], big)])), None, False
    if kind == "impostor":      # a joined rank's number from another connection
        frames = wire(P.encode(Op.PUSH, t, rank, 0, [(b, grads[b] + 1e6) for b in bucket]))
        return frames, f"rank {rank} already joined from another connection", False
    if kind == "wrong_op":
        op = Op(int(rng.choice([Op.PARAMS, Op.INIT, Op.ERROR, Op.HELLO, Op.BARRIER])))
        frames = wire(P.encode(op, t, rank, 0, [(b, grads[b] + 1e6) for b in bucket]))
        return frames, f"{op.name} during iteration {t} (expected PUSH)", True
    if kind == "join_twice":    # INIT for a joined rank from another connection
        return wire(init_frames(rank, grads, 2)), \
            f"rank {rank} already joined from another connection", False
    if kind == "flags":
        return [with_header(good[0], flags=P.FLAG_SHM)] + good[1:], \
            "after a shared-memory header", True
    raise AssertionError(kind)


class Client:
    """One DEALER and what it has received."""

    def __init__(self, ctx, endpoint):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.got = []

    def send(self, frames):
        self.sock.send_multipart(frames)

    def recv_until(self, done, deadline, what):
        while not done(self.got):
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} before the deadline; got {self.summary()}"
            if self.sock.poll(int(min(left, 0.2) * 1000)):
                self.got.append(P.decode(self.sock.recv_multipart()))

    def take(self, op):
        out = [m for m in self.got if m.op == op]
        self.got = [m for m in self.got if m.op != op]
        return out

    def summary(self):
        return [(m.op.name, m.iteration, m.text() if m.op in (Op.ERROR, Op.ABORT) else
                 [q.blob_id for q in m.payloads]) for m in self.got]


def check_errors(errors, expected, who):
    texts = [m.text() for m in errors]
    left = list(texts)
    for reason in expected:
        hit = [x for x in left if reason in x]
        assert hit, f"{who}: no ERROR naming {reason!r}; got {texts}"
        left.remove(hit[0])
    assert not left, f"{who}: unexpected ERRORs {left}"


@pytest.mark.parametrize("index", range(N_SCENARIOS))
def test_a_shard_survives_bad_clients(index):
    sc = Scenario(index)
    rng = sc.rng
    W, nb = sc.W, sc.nb
    w0 = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    shard = Shard(W, sc.timeout)
    ctx = zmq.Context()
    clients = [Client(ctx, shard.endpoint) for _ in range(W)]
    strangers = []

    def push(r, t, b, grads, bump=0.0):
        clients[r].send(P.encode(Op.PUSH, t, r, 0, [(k, grads[r][k] + np.float32(bump))
                                                    for k in sc.bucket_blobs[b]]))

    def send_fault(kind, r, t, grads, expect_err, answered, join=False):
        """Send one bad message; record the answer expected (own connection or a stranger)."""
        b = int(rng.integers(nb))
        frames, reason, own = bad_message(kind, r, t, W, sc.bucket_blobs[b], grads, rng)
        if join and kind in EARLY:
            reason = "PUSH before every rank has joined"
        if own:
            clients[r].send(frames)
            if reason is not None:
                expect_err[r].append(reason)
        else:
            s = Client(ctx, shard.endpoint)
            strangers.append(s)
            s.send(frames)
            if reason is not None:
                answered.append((s, reason))

    def wait_strangers(answered, deadline):
        for s, reason in answered:
            s.recv_until(lambda g: len(g) >= 1, deadline, "ERROR")
            check_errors(s.take(Op.ERROR), [reason], f"{sc.describe()}: a stranger")

    def wait_abort(want, skip, deadline):
        for r in range(W):
            if r == skip:
                continue
            clients[r].recv_until(lambda g: any(m.op == Op.ABORT for m in g), deadline, "ABORT")
            (ab,) = clients[r].take(Op.ABORT)
            wants = (want,) if isinstance(want, str) else want
            assert any(x in ab.text() for x in wants), (sc.describe(), ab.text())

    try:
        # ------------------------------------------------------------- join
        deadline = time.monotonic() + sc.timeout + SLACK
        expect_err = {r: [] for r in range(W)}
        answered = []
        solver = {"type": solver_bytes(type="Bogus"),
                  "lr_policy": solver_bytes(lr_policy="bogus")}.get(sc.hostile_solver)
        for r in range(W):
            for kind, who in sc.join_faults:
                if who != r:
                    continue
                if kind == "push_before_join":
                    clients[r].send(wire(P.encode(Op.PUSH, 0, r, 0, [(0, w0[0])])))
                    expect_err[r].append("PUSH before every rank has joined")
                elif kind == "bad_init":
                    clients[r].send(wire(init_frames(r, w0, nb, table=[0, 2])))
                    expect_err[r].append("must be numbered 0..B-1")
                else:
                    send_fault(kind, r, 0, w0, expect_err, answered, join=True)
            clients[r].send(wire(init_frames(r, w0, nb, solver=solver)))
        if sc.hostile_solver:      # every rank sent it: the join fails for all, named
            wait_abort("unknown solver type 'Bogus'" if sc.hostile_solver == "type" else
                       "Unknown learning rate policy: bogus", None, deadline)
            assert shard.finish(sc.timeout + SLACK) == 1
            return
        for r in range(W):
            n = len(expect_err[r])
            clients[r].recv_until(lambda g: sum(m.op == Op.PARAMS for m in g) == 1
                                  and sum(m.op == Op.ERROR for m in g) == n, deadline,
                                  "join answer")
            (params,) = clients[r].take(Op.PARAMS)
            assert params.iteration == 0
            for q, a in zip(params.payloads, w0):
                np.testing.assert_array_equal(q.array, a)
            check_errors(clients[r].take(Op.ERROR), expect_err[r],
                         f"{sc.describe()}: rank {r} at the join")
        wait_strangers(answered, deadline)

        # ----------------------------------------------------------- rounds
        ref = Reference(w0)
        for t in range(ROUNDS):
            start = time.monotonic()
            deadline = start + sc.timeout + SLACK
            grads = [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(W)]
            expect_err = {r: [] for r in range(W)}
            answered = []
            fatal = sc.fatal if sc.fatal and sc.fatal[2] == t else None
            bad = fatal[1] if fatal else None
            faults = {r: [k for k, who in sc.round_faults[t] if who == r] for r in range(W)}
            # 1. the strangers' messages, answered while the round waits for pushes
            for r in range(W):
                for kind in faults[r]:
                    if kind != "duplicate":
                        frames, reason, own = bad_message(kind, r, t, W, sc.bucket_blobs[0],
                                                          grads[r], rng)
                        if not own:
                            send_fault(kind, r, t, grads[r], expect_err, answered)
            wait_strangers(answered, deadline)
            # 2. bad messages on the ranks' own connections (read before their pushes)
            for r in range(W):
                for kind in faults[r]:
                    if kind != "duplicate" and bad_message(kind, r, t, W, sc.bucket_blobs[0],
                                                           grads[r], rng)[2]:
                        send_fault(kind, r, t, grads[r], expect_err, {})
            # 3. duplicates, one rank at a time, while the round still waits for another push
            pushed = {r: set() for r in range(W)}
            left = W * nb
            for r in range(W):
                if r == bad or "duplicate" not in faults[r] or left == 1:
                    continue
                b = int(rng.integers(nb))
                push(r, t, b, grads)
                pushed[r].add(b)
                left -= 1
                push(r, t, b, grads, bump=1e6)
                what = "" if nb == 1 else f" bucket {b} of"
                clients[r].recv_until(lambda g: any(m.op == Op.ERROR and "twice" in m.text()
                                                    for m in g), deadline, "duplicate's ERROR")
                expect_err[r].append(f"rank {r} pushed{what} iteration {t} twice")
            # 4. the rest of the pushes; the fatal rank pushes part and aborts or vanishes
            for r in range(W):
                if r == bad:
                    keep = int(rng.integers(nb))     # buckets it pushes before it goes
                    for b in range(keep):
                        push(r, t, b, grads)
                    if fatal[0] == "abort":
                        clients[r].send(P.encode_text(Op.ABORT, t, r, 0, "fuzz: out of memory"))
                    else:
                        clients[r].sock.close(linger=1000)
                    continue
                for b in range(nb):
                    if b not in pushed[r]:
                        push(r, t, b, grads)
            if fatal:
                want = (f"rank {bad} aborted: fuzz: out of memory" if fatal[0] == "abort" else
                        f"iteration {t}: no gradients from rank(s) {bad} within")
                if fatal[0] == "vanish" and keep:   # a bucket completed: its answer may find
                    #                                 the rank gone, or the round times out
                    want = (want, f"iteration {t + 1}: cannot answer rank(s) {bad}")
                wait_abort(want, bad, deadline)
                ref.update(sum(sc.bucket_blobs[:keep], []), grads)
                for r in range(W):                  # a bucket answered before: good values
                    for m in clients[r].take(Op.PARAMS):
                        for q in m.payloads:
                            np.testing.assert_allclose(q.array, ref.w[q.blob_id], rtol=1e-5,
                                                       atol=1e-6, err_msg=sc.describe())
                assert shard.finish(SLACK) == 1
                return
            ref.update([0, 1], grads)
            for r in range(W):
                n = len(expect_err[r])
                clients[r].recv_until(lambda g: sum(m.op == Op.PARAMS for m in g) == nb
                                      and sum(m.op == Op.ERROR for m in g) == n, deadline,
                                      f"round {t} answers")
                check_errors(clients[r].take(Op.ERROR), expect_err[r],
                             f"{sc.describe()}: rank {r} in round {t}")
                answers = clients[r].take(Op.PARAMS)
                assert all(m.iteration == t + 1 for m in answers)
                got = {q.blob_id: q.array for m in answers for q in m.payloads}
                assert sorted(got) == [0, 1]
                for k in (0, 1):    # the good gradients only, whatever was rejected
                    np.testing.assert_allclose(got[k], ref.w[k], rtol=1e-5, atol=1e-6,
                                               err_msg=f"{sc.describe()}: blob {k}, round {t}")
        assert shard.finish(SLACK) == 0
    finally:
        for c in clients + strangers:
            c.sock.close(linger=0)
        ctx.term()
        if shard.thread.is_alive():       # a failed check: the shard gives up at its timeout
            shard.thread.join(sc.timeout + SLACK)


@pytest.mark.parametrize("over, reason", [
    ({"type": "Bogus"}, "rank 0's INIT: unknown solver type 'Bogus' (known: "),
    ({"lr_policy": "bogus"}, "rank 0's INIT: solver: Unknown learning rate policy: bogus")])
def test_a_hostile_solver_fails_the_join_by_name(over, reason):
    """Regression (found by the fuzz): the shard raised from ShardSolver (unknown type, at the
    join) or from get_learning_rate (unknown lr_policy, at the first round) with a traceback,
    and the workers waited for their timeout.  Now the join fails and every rank is told."""
    shard = Shard(1, TIMEOUT)
    ctx = zmq.Context()
    c = Client(ctx, shard.endpoint)
    try:
        c.send(wire(init_frames(0, [np.zeros(s, np.float32) for s in SHAPES], 1,
                                solver=solver_bytes(**over))))
        c.recv_until(lambda g: len(g) >= 1, time.monotonic() + SLACK, "ABORT")
        (ab,) = c.take(Op.ABORT)
        assert reason in ab.text(), ab.text()
        assert shard.finish(SLACK) == 1
    finally:
        c.sock.close(linger=0)
        ctx.term()
