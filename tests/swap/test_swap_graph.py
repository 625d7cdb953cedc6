"""swap.graph on the CPU: which waits a capture drops, which steps run eagerly, why a graph
is refused, that asking for one in CPU mode trains on eagerly, and the order of a capture and
its launches (and of a failed capture) with stand-ins for CuPy.  The capture itself runs on the
GPU (test_swap_graph_gpu.py)."""
import numpy as np

from swap.graph import capture_calls, data_prefix, why_not_capturable
from swap.runtime import install


def rec(ev):
    return ("record", (ev, "stream"))


def wait(ev):
    return ("wait", ("stream", ev, 0))


def tables(steps):
    """[(before calls, after calls)] -> compiled-style tables with empty binds."""
    return ([(tuple(b), ()) for b, _ in steps], [(tuple(a), ()) for _, a in steps])


def run(steps, start, recorded):
    before, after = tables(steps)
    return capture_calls(before, after, start, lambda f: f == "record",
                         lambda f: f == "wait", set(recorded))


def test_a_capture_keeps_waits_on_events_recorded_in_it_and_drops_the_others():
    steps = [([wait("free0")], [rec("s0")]),           # 0: eager data step
             ([wait("s0"), wait("free1")], [rec("s1"), ("copy", (1, 2))]),
             ([wait("s1"), wait("late")], [rec("late")]),
             ([wait("late"), wait("fork")], [])]
    b, a, dropped = run(steps, 1, {"fork"})
    assert b[0] == ((), ()) and a[0] == ((), ())       # the eager steps are not in it
    assert b[1][0] == ()                               # s0: the eager step's; free1: earlier
    assert a[1][0] == (rec("s1"), ("copy", (1, 2)))
    assert b[2][0] == (wait("s1"),)                    # late: recorded only after the wait
    assert b[3][0] == (wait("late"), wait("fork"))     # now recorded in the capture
    assert dropped == 3


def test_a_record_before_a_wait_in_the_same_side_counts():
    b, a, dropped = run([([rec("e"), wait("e")], [wait("e")])], 0, set())
    assert b[0][0] == (rec("e"), wait("e")) and a[0][0] == (wait("e"),) and dropped == 0


class _Layer:
    def __init__(self, type):
        self.type = type
        self.name = type.lower()


class _Net:
    def __init__(self, types, bottoms):
        self.layers = [_Layer(t) for t in types]
        self.bottom_vecs = bottoms


def test_the_data_prefix_is_the_leading_forwards_of_data_layers():
    net = _Net(["DummyData", "HDF5Data", "Convolution", "Data"], [[], [], ["x"], []])
    assert data_prefix(net, [True, True, True, True, False], [0, 1, 2, 3, 2]) == 2
    assert data_prefix(net, [True, True], [2, 0]) == 0
    assert data_prefix(net, [False], [0]) == 0


def test_a_cpu_executor_refuses_the_graph_and_trains_on(make_solver):
    def train(graph):
        s = make_solver("resnet")
        ex = install(s, "naive")
        s.cuda_graph = graph     # as --cuda-graph: the solver asks the executor
        s.step(3)
        out = [np.array(p.data) for p in s.net.learnable_params], ex
        ex.close()
        return out
    ref, _ = train(False)
    got, ex = train(True)
    assert ex.graph_wanted and ex._graph is None and ex.graph_refused == "CPU mode"
    for p, q in zip(got, ref):
        np.testing.assert_array_equal(p, q)


def test_every_reason_is_named(make_solver):
    s = make_solver("resnet")
    ex = install(s, "naive")
    s.net.forward_listener = lambda li: None
    s.net.backward_listener = lambda li: None
    reasons = why_not_capturable(ex)
    assert reasons[0] == "CPU mode"
    assert any("forward listener" in r for r in reasons)
    assert any("backward listener" in r for r in reasons)

    class Hook:
        handles_backward_listener = True
    assert not any("backward listener" in r for r in why_not_capturable(ex, [Hook()]))
    ex.close()


# ------------------------------------------------ the capture's control flow, with stand-ins
class _Ev:
    n = 0

    def __init__(self, **kw):
        _Ev.n += 1
        self.ptr = _Ev.n

    def record(self, stream):
        stream.log.append(("record", self.ptr))


class _Graph:
    def __init__(self, log):
        self.log = log

    def upload(self, stream):
        self.log.append("upload")

    def launch(self, stream):
        self.log.append("launch")


class _Stream:
    def __init__(self, log, name, fail_end=False):
        self.log, self.name, self.fail_end = log, name, fail_end
        self.ptr = id(self)

    def wait_event(self, e):
        self.log.append((self.name, "wait", e.ptr))

    def begin_capture(self, mode):
        self.log.append("begin")

    def end_capture(self):
        self.log.append("end")
        if self.fail_end:
            raise RuntimeError("capture invalidated")
        return _Graph(self.log)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Pool:
    def __init__(self, *a):
        self.freed = 0

    def malloc(self, n):
        raise AssertionError("no allocation here")

    def free_all_blocks(self):
        self.freed += 1


def _fake(monkeypatch, fail_in=None, fail_end=False):
    import contextlib
    from types import SimpleNamespace
    from swap import graph as G
    log = []
    cuda = SimpleNamespace(
        Stream=lambda non_blocking=True: _Stream(log, "graph", fail_end),
        Event=_Ev, MemoryPool=_Pool,
        using_allocator=lambda f: contextlib.nullcontext(),
        runtime=SimpleNamespace(eventRecord=object(), streamWaitEvent=object(),
                                streamCaptureModeRelaxed=2))
    cp = SimpleNamespace(cuda=cuda)
    from swap.plan import COMPUTE, SWAP_IN, SWAP_OUT
    streams = {COMPUTE: _Stream(log, "compute"), SWAP_IN: _Stream(log, "in"),
               SWAP_OUT: _Stream(log, "out")}
    steps = []

    def run_steps(before, after, start, stop, sc):
        steps.append((start, stop))
        if fail_in == (start, stop) and steps.count(fail_in) == 1:   # in the capture only
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.0 if start == 0 and stop == 1 else "loss"

    net = SimpleNamespace(forward_listener=None, backward_listener=None, name="n",
                          layers=[SimpleNamespace(type="DummyData", name="d", blobs=[],
                                                  internals={}),
                                  SimpleNamespace(type="ReLU", name="r", blobs=[],
                                                  internals={})],
                          bottom_vecs=[[], ["d"]], xp=np)
    ex = SimpleNamespace(
        net=net, streams=SimpleNamespace(gpu=True, cp=cp, streams=streams), _recomputes=(),
        _wrappers=lambda: (None, None, None), _fwd=[True, True, False], _layer=[0, 1, 1],
        graph_hooks=[], _end_wait=[], _allocator=None, _compiled=None,
        _compile=lambda: ([((), ())] * 3, [((), ())] * 3, None), _run_steps=run_steps,
        plan=SimpleNamespace(strategy="naive"))
    monkeypatch.setattr("minicaffe.cublas.enabled_for", lambda xp: False)
    return G.CapturedIteration(ex), ex, log, steps


class _Hook:
    handles_backward_listener = True

    def __init__(self):
        self.calls = []

    def capturing(self):
        self.calls.append("capturing")

    def captured(self, stream):
        self.calls.append("captured")

    def capture_ended(self, ok):
        self.calls.append(("ended", ok))

    def launched(self):
        self.calls.append("launched")


def test_a_capture_then_launches(monkeypatch):
    g, ex, log, steps = _fake(monkeypatch)
    hook = _Hook()
    g.hooks.append(hook)
    assert g.prefix == 1
    assert g.run(None) == "loss" and g.captures == 1 and g.launches == 1
    assert steps == [(0, 1), (1, 3)]                 # data step eagerly, then the capture
    assert log.index("begin") < log.index("end") < log.index("upload") < log.index("launch")
    assert g.run(None) == "loss" and g.launches == 2 and g.captures == 1
    assert steps[-1] == (0, 1)                       # a launch runs only the data step
    assert hook.calls == ["capturing", "captured", ("ended", True), "launched", "launched"]


def test_a_failed_capture_ends_it_tells_the_hooks_and_runs_eagerly(monkeypatch):
    from swap.graph import _Fallback
    for kw in ({"fail_in": (1, 3)}, {"fail_end": True}):
        g, ex, log, steps = _fake(monkeypatch, **kw)
        hook = _Hook()
        g.hooks.append(hook)
        try:
            g.run(None)
        except _Fallback as f:
            assert f.loss == "loss"                  # the eager rerun's
            assert isinstance(f.__cause__, RuntimeError)
        else:
            raise AssertionError("no fallback")
        assert "end" in log and "launch" not in log and g.graph is None and g.pool is None
        assert hook.calls == (["capturing", ("ended", False)] if "fail_in" in kw
                              else ["capturing", "captured", ("ended", False)])
        assert steps[-2:] == [(1, 3), (1, 3)]        # the capture, then the same steps eagerly


def test_wrapped_streams_keep_the_graph_waiting_not_refused(monkeypatch):
    """A profiler that wraps the streams' methods for a while makes those iterations eager;
    it does not refuse the graph for good."""
    from types import SimpleNamespace
    from swap.runtime import Executor
    built = []
    ex = SimpleNamespace(_wrappers=lambda: (print, None, None),
                         graph=lambda: built.append(1))
    assert Executor._run_graph(ex, None) is None and built == []
