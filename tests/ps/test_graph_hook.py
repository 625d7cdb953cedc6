"""ps.worker._GraphHook on the CPU with stand-ins: what a PS worker does around its executor's
CUDA graph (swap.graph).  The capture itself and the external events run on the GPU
(tests/ps/test_gpu.py::test_ps_gpu_cuda_graph_under_a_swap_plan_gives_the_parameters_of_eager)."""
from types import SimpleNamespace

from ps.worker import _GraphHook


class _Overlap:
    def __init__(self, n):
        self.issued = [False] * n
        self.resets = 0

    def reset(self):
        self.issued = [False] * len(self.issued)
        self.resets += 1


class _Recorder:
    def __init__(self):
        self.calls = []

    def record(self, stream):
        self.calls.append(("record", stream))

    def wait_event(self, event):
        self.calls.append(("wait", event))

    def bucket(self, iteration, g, done):
        self.calls.append(("bucket", iteration, g, done))


def _worker(n=3):
    return SimpleNamespace(_capturing=False, _captured=[], overlap=_Overlap(n),
                           _round=_Recorder(), _copy_done=[f"done{g}" for g in range(n)],
                           _copy_joined=_Recorder(), _copy_stream="copy",
                           solver=SimpleNamespace(iter=7))


def test_buckets_captured_once_go_to_the_round_thread_after_every_launch():
    w = _worker()
    hook = _GraphHook(w)
    assert hook.handles_backward_listener
    hook.capturing()
    assert w._capturing and w._captured == []
    w._captured += [2, 0]               # backward's order during the capture
    graph_stream = _Recorder()
    hook.captured(graph_stream)         # the copy stream joins the graph's end
    assert w._copy_joined.calls == [("record", "copy")]
    assert graph_stream.calls == [("wait", w._copy_joined)]
    hook.capture_ended(True)
    assert not w._capturing and w._captured == [2, 0]
    for it in (7, 8):
        w.solver.iter = it
        w.overlap.reset()               # the update of the previous round
        hook.launched()
        assert w.overlap.issued == [True, False, True]     # flush leaves them alone
        assert w._round.calls[-2:] == [("bucket", it, 2, "done2"), ("bucket", it, 0, "done0")]
    assert len(w._round.calls) == 4


def test_a_failed_capture_leaves_the_buckets_to_the_eager_rerun():
    w = _worker()
    hook = _GraphHook(w)
    hook.capturing()
    w._captured.append(1)
    w.overlap.issued[1] = True          # the listener ran during the capture
    hook.capture_ended(False)
    assert not w._capturing and w._captured == []
    assert w.overlap.issued == [False] * 3 and w.overlap.resets == 1
    hook.launched()                     # (no launch follows a failed capture; harmless)
    assert w._round.calls == []
