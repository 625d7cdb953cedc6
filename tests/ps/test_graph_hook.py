"""ps.worker._GraphHook on the CPU with stand-ins: what a PS worker does around its executor's
CUDA graph (swap.graph).  The capture itself and the external events run on the GPU
(tests/ps/test_gpu.py::test_ps_gpu_cuda_graph_under_a_swap_plan_gives_the_parameters_of_eager)."""
from types import SimpleNamespace

import pytest

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


@pytest.mark.parametrize("comm, overlap, layer_wise, env, graph_after", [
    ("nccl", None, True, None, False),     # overlap by the solver's layer_wise_reduce: eager
    ("nccl", None, False, None, True),     # all-reduce after backward: the graph stays
    ("nccl", False, True, None, True),     # --no-overlap
    ("nccl", None, False, "1", False),     # MINICAFFE_PS_OVERLAP=1 over layer_wise_reduce
    ("ps", None, True, None, True),        # the parameter server's worker has a graph hook
])
def test_an_nccl_worker_overlapping_backward_runs_eagerly(monkeypatch, caplog, comm, overlap,
                                                          layer_wise, env, graph_after):
    """--cuda-graph with --comm nccl and overlap: no graph hook replays the NCCL worker's
    per-layer listener, so the CLI turns the graph off before --swap dynamic plans for it
    (session 45: a plan decided for graph launches ran eagerly 28 % slower), and says so."""
    from minicaffe.cli import _eager_under_nccl_overlap
    from minicaffe.proto import caffe_pb2
    if env is None:
        monkeypatch.delenv("MINICAFFE_PS_OVERLAP", raising=False)
    else:
        monkeypatch.setenv("MINICAFFE_PS_OVERLAP", env)
    param = caffe_pb2.SolverParameter(layer_wise_reduce=layer_wise)
    solver = SimpleNamespace(param=param, cuda_graph=True)
    args = SimpleNamespace(ps="tcp://127.0.0.1:1", comm=comm, overlap=overlap)
    _eager_under_nccl_overlap(args, solver)
    assert solver.cuda_graph is graph_after
    solver.cuda_graph = False
    _eager_under_nccl_overlap(args, solver)            # never turns it on
    assert solver.cuda_graph is False
    args.ps = None
    solver.cuda_graph = True
    _eager_under_nccl_overlap(args, solver)            # not a data-parallel worker
    assert solver.cuda_graph is True
