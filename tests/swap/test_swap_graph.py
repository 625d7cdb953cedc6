"""swap.graph on the CPU: which waits a capture drops, which steps run eagerly, why a graph
is refused, and that asking for one in CPU mode trains on eagerly.  The capture itself runs
on the GPU (test_swap_graph_gpu.py)."""
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
    assert ex._graph_wanted and ex._graph is None and ex.graph_refused == "CPU mode"
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
