"""minicaffe.graph and the solver's cuda_graph option.

CPU: what keeps an iteration out of a CUDA graph (the cuBLAS binding among the
reasons), ``Solver(cuda_graph=True)``/``MINICAFFE_CUDA_GRAPH``/``--cuda-graph``
parsing, and the fallback: an iteration that cannot be captured runs eagerly,
the same numbers, with the reasons logged once.  GPU: a LeNet-like net and a
small CAFFE-engine conv net trained 5 iterations through IterationGraph (and
through ``Solver(cuda_graph=True)``) match eager training: losses and
parameters within float32 tolerance, one capture."""
import io

import numpy as np
import pytest

from minicaffe import cublas
from minicaffe import engine as engines
from minicaffe import graph
from minicaffe.log import set_stream
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver, cuda_graph_from_env

BATCH = 8

# LeNet-like: convolutions (one grouped) and two InnerProducts; Input blobs written once
LENET = f"""
name: "lenet_like"
layer {{ name: "data" type: "Input" top: "data"
        input_param {{ shape {{ dim: {BATCH} dim: 1 dim: 12 dim: 12 }} }} }}
layer {{ name: "label" type: "Input" top: "label" input_param {{ shape {{ dim: {BATCH} }} }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 6 kernel_size: 5 engine: CAFFE
                            weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
layer {{ name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param {{ num_output: 8 kernel_size: 3 group: 2 engine: CAFFE
                            weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "conv2" top: "ip1"
        inner_product_param {{ num_output: 32 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "relu3" type: "ReLU" bottom: "ip1" top: "ip1" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }}
"""

# a small conv net in the CAFFE engine: padded 3x3, 1x1 with groups, AVE pooling,
# a transposed InnerProduct
CONVNET = f"""
name: "convnet"
layer {{ name: "data" type: "Input" top: "data"
        input_param {{ shape {{ dim: {BATCH} dim: 3 dim: 10 dim: 10 }} }} }}
layer {{ name: "label" type: "Input" top: "label" input_param {{ shape {{ dim: {BATCH} }} }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 8 kernel_size: 3 pad: 1 engine: CAFFE
                            weight_filler {{ type: "msra" }}
                            bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param {{ num_output: 12 kernel_size: 1 group: 2 engine: CAFFE
                            weight_filler {{ type: "msra" }} }} }}
layer {{ name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }}
layer {{ name: "conv3" type: "Convolution" bottom: "conv2" top: "conv3"
        convolution_param {{ num_output: 8 kernel_size: 3 stride: 2 engine: CAFFE
                            weight_filler {{ type: "msra" }} }} }}
layer {{ name: "pool" type: "Pooling" bottom: "conv3" top: "pool"
        pooling_param {{ pool: AVE kernel_size: 2 stride: 2 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param {{ num_output: 5 transpose: true
                              weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""

# LeNet-like with Dropout: in place on a convolution's output, and not in place before ip2
LENET_DROPOUT = (LENET
                 .replace('layer { name: "ip1"',
                          'layer { name: "drop2" type: "Dropout" bottom: "conv2" top: "conv2" '
                          'dropout_param { dropout_ratio: 0.2 } }\nlayer { name: "ip1"')
                 .replace('layer { name: "ip2" type: "InnerProduct" bottom: "ip1"',
                          'layer { name: "drop3" type: "Dropout" bottom: "ip1" top: "drop3" }\n'
                          'layer { name: "ip2" type: "InnerProduct" bottom: "drop3"'))

# the CPU tests' net: host-fed DummyData, a convolution and an InnerProduct
TINY = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 2 dim: 5 dim: 5 } shape { dim: 4 }
                           data_filler { type: "gaussian" std: 1 }
                           data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def solver_param(net_text, mode="CPU", display=0):
    p = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=100, display=display,
                                  random_seed=1)
    p.net_param.CopyFrom(parse_text(net_text, caffe_pb2.NetParameter))
    p.solver_mode = getattr(caffe_pb2.SolverParameter, mode)
    return p


@pytest.fixture
def logged():
    buf = io.StringIO()
    set_stream(buf)
    yield buf
    set_stream(None)


# ================================================================ CPU
def test_cpu_solver_is_refused_with_the_reason():
    s = Solver(solver_param(TINY), verbose=False)
    reasons = graph.why_not_capturable(s)
    assert any("not GPU mode" in r for r in reasons)
    assert not any("cuBLAS" in r for r in reasons)  # the GPU reason covers it


def test_cublas_reason_names_the_gemm_layers(monkeypatch):
    """As on a GPU without the binding: InnerProduct and CAFFE-engine convolutions are
    refused with the binding's own reason; with the binding active, nothing is."""
    s = Solver(solver_param(TINY), verbose=False)
    monkeypatch.setattr(graph.cuda_fused, "enabled_for", lambda xp, dtype=None: True)
    monkeypatch.setattr(s, "fused_sgd", lambda: object())
    monkeypatch.setattr(graph.cublas, "enabled_for", lambda xp: False)
    monkeypatch.setattr(graph.cublas, "unavailable_reason", lambda xp=None: "no libcublas here")
    reasons = graph.why_not_capturable(s)
    assert len(reasons) == 1
    assert "'conv', 'ip'" in reasons[0] and "refuses stream capture" in reasons[0]
    assert reasons[0].endswith("no libcublas here")
    monkeypatch.setattr(graph.cublas, "enabled_for", lambda xp: True)
    assert graph.why_not_capturable(s) == []


def test_dropout_is_capturable_accuracy_is_not(monkeypatch):
    """As on a GPU with everything else in place: Dropout (its counter read and advanced
    on the device) gives no reason; a layer not known to capture still does."""
    s = Solver(solver_param(LENET_DROPOUT), verbose=False)
    assert [layer.type for layer in s.net.layers].count("Dropout") == 2
    monkeypatch.setattr(graph.cuda_fused, "enabled_for", lambda xp, dtype=None: True)
    monkeypatch.setattr(graph.cublas, "enabled_for", lambda xp: True)
    monkeypatch.setattr(s, "fused_sgd", lambda: object())
    assert "Dropout" in graph.CAPTURABLE_TYPES
    assert graph.why_not_capturable(s) == []
    text = LENET_DROPOUT + (
        'layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" }\n')
    s = Solver(solver_param(text), verbose=False)
    monkeypatch.setattr(s, "fused_sgd", lambda: object())
    assert graph.why_not_capturable(s) == [
        "layer 'acc' of type Accuracy is not known to be capturable"]


def test_cudnn_convolutions_do_not_need_the_binding():
    s = Solver(solver_param(TINY), verbose=False)
    assert graph.gemm_layers(s.net) == ["conv", "ip"]
    s.net.layers[1].engine = engines.CUDNN
    assert graph.gemm_layers(s.net) == ["ip"]


def test_cuda_graph_from_the_environment(monkeypatch):
    for text, want in (("", False), ("0", False), ("off", False), ("1", True), ("yes", True)):
        assert cuda_graph_from_env({"MINICAFFE_CUDA_GRAPH": text}) is want
    with pytest.raises(ValueError, match="MINICAFFE_CUDA_GRAPH='maybe'"):
        cuda_graph_from_env({"MINICAFFE_CUDA_GRAPH": "maybe"})
    monkeypatch.setenv("MINICAFFE_CUDA_GRAPH", "1")
    assert Solver(solver_param(TINY), verbose=False).cuda_graph
    assert not Solver(solver_param(TINY), verbose=False, cuda_graph=False).cuda_graph
    monkeypatch.delenv("MINICAFFE_CUDA_GRAPH")
    assert not Solver(solver_param(TINY), verbose=False).cuda_graph


def test_not_capturable_runs_eagerly_and_says_why_once(logged):
    a = Solver(solver_param(TINY), verbose=False, cuda_graph=True)
    a.step(4)
    b = Solver(solver_param(TINY), verbose=False)
    b.step(4)
    for pa, pb in zip(a.net.learnable_params, b.net.learnable_params):
        np.testing.assert_array_equal(pa.data, pb.data)
    assert float(a.last_loss) == float(b.last_loss) and a.iter == b.iter == 4
    text = logged.getvalue()
    assert text.count("cuda_graph: iterations run eagerly") == 1
    assert "not GPU mode" in text and a.graph is None and "not GPU mode" in a.graph_refused


def test_callbacks_keep_iterations_eager(logged):
    s = Solver(solver_param(TINY), verbose=False, cuda_graph=True)

    class Hook:
        seen = 0

        def on_gradients_ready(self, solver):
            Hook.seen += 1
    s.callbacks.append(Hook())
    s.step(2)
    assert Hook.seen == 2 and "solver callbacks" in logged.getvalue()
    s.callbacks.clear()
    s.step(2)  # now the net's own reason: logged when it changes
    text = logged.getvalue()
    assert text.count("iterations run eagerly") == 2 and "not GPU mode" in text


def test_replaced_apply_update_keeps_iterations_eager(logged):
    s = Solver(solver_param(TINY), verbose=False, cuda_graph=True)
    calls = []
    s.apply_update = lambda display=False: calls.append(display)  # as ps/ workers do
    s.step(3)
    assert len(calls) == 3 and "apply_update is replaced" in logged.getvalue()


def test_cli_flag(tmp_path, capsys):
    from minicaffe.cli import build_parser, main
    net = tmp_path / "tiny.prototxt"
    net.write_text(TINY)
    assert build_parser().parse_args(["train", str(net), "--cuda-graph"]).cuda_graph
    assert not build_parser().parse_args(["train", str(net)]).cuda_graph
    rc = main(["train", str(net), "--cpu", "--cuda-graph", "--max-iter", "2", "--display", "1",
               "--snapshot-prefix", str(tmp_path / "s")])
    assert rc == 0
    err = capsys.readouterr().err
    assert "cuda_graph: iterations run eagerly: not GPU mode" in err
    assert "Optimization Done." in err


# ================================================================ GPU
def _gpu_solver(cp, text, display=0, cuda_graph=False):
    """A GPU solver whose Input blobs hold fixed random images and labels."""
    s = Solver(solver_param(text, "GPU", display), verbose=display > 0, cuda_graph=cuda_graph)
    r = np.random.default_rng(0)
    data = s.net.blobs["data"]
    data.data[...] = cp.asarray(r.standard_normal(data.shape), dtype=cp.float32)
    n_class = s.net.blobs["ip2" if "ip2" in s.net.blobs else "ip"].shape[1]
    s.net.blobs["label"].data[...] = cp.asarray(r.integers(0, n_class, BATCH), dtype=cp.float32)
    return s


def _params(s):
    return [p.data.get() for p in s.net.learnable_params]


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture
def gpu_graph_ready(cp):
    if not cublas.enabled_for(cp):
        pytest.fail("minicaffe.cublas is not usable here: " + cublas.unavailable_reason(cp))


@pytest.mark.gpu
@pytest.mark.parametrize("text", [LENET, CONVNET], ids=["lenet_like", "convnet"])
def test_iteration_graph_trains_as_eager(cp, gpu_graph_ready, text):
    eager = _gpu_solver(cp, text)
    assert graph.why_not_capturable(eager) == []
    want = []
    for _ in range(5):
        eager.step(1)
        want.append(float(eager.last_loss))
    s = _gpu_solver(cp, text)
    assert any(not np.array_equal(pa, pb)  # eager training moved the weights
               for pa, pb in zip(_params(s), _params(eager)))
    g = graph.IterationGraph(s)
    got = [float(g.step()) for _ in range(5)]  # 2 eager warm-ups, then capture and replays
    assert g.captures == 1 and g.graph is not None and s.iter == 5
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[-1] != got[0]  # it trains
    for pg, pe in zip(_params(s), _params(eager)):
        assert _rel(pg, pe) <= 1e-5
    for hg, he in zip(s.history, eager.history):
        assert _rel(hg.get(), he.get()) <= 1e-5


@pytest.mark.gpu
def test_solver_cuda_graph_option_trains_as_eager(cp, gpu_graph_ready, logged):
    eager = _gpu_solver(cp, LENET, display=2)
    eager.step(6)
    s = _gpu_solver(cp, LENET, display=2, cuda_graph=True)
    s.step(6)
    assert isinstance(s.graph, graph.IterationGraph) and s.graph.captures == 1
    assert s.iter == 6 and not s.graph_refused
    assert abs(float(s.last_loss) - float(eager.last_loss)) <= 1e-5 * abs(float(eager.last_loss))
    for pg, pe in zip(_params(s), _params(eager)):
        assert _rel(pg, pe) <= 1e-5
    text = logged.getvalue()
    assert "iterations run eagerly" not in text
    assert text.count("Iteration 4, lr = 0.05") == 2  # eager's apply_update and the graph's


@pytest.mark.gpu
def test_without_the_binding_gemm_layers_refuse_capture(cp, gpu_graph_ready):
    s = _gpu_solver(cp, LENET)
    with cublas.disabled():
        reasons = graph.why_not_capturable(s)
    assert len(reasons) == 1 and "'conv1', 'conv2', 'ip1', 'ip2'" in reasons[0]
    assert "MINICAFFE_CUBLAS" in reasons[0]
    assert graph.why_not_capturable(s) == []


def _masks(s):
    return {layer.name: layer.internal("mask").data.get()
            for layer in s.net.layers if layer.type == "Dropout"}


@pytest.mark.gpu
def test_iteration_graph_replays_fresh_dropout_masks(cp, gpu_graph_ready):
    """Each replay draws the next mask from the counter in device memory: the same
    masks as eager iterations, bit for bit, hence the same losses; the masks change
    from one replay to the next and the counters end equal."""
    eager = _gpu_solver(cp, LENET_DROPOUT)
    assert graph.why_not_capturable(eager) == []
    want, want_masks = [], []
    for _ in range(6):
        eager.step(1)
        want.append(float(eager.last_loss))
        want_masks.append(_masks(eager))
    s = _gpu_solver(cp, LENET_DROPOUT)
    drops = [layer for layer in s.net.layers if layer.type == "Dropout"]
    assert all(layer._fused for layer in drops)
    g = graph.IterationGraph(s)
    got, got_masks = [], []
    for _ in range(6):  # 2 eager warm-ups, then capture and 4 replays
        got.append(float(g.step()))
        got_masks.append(_masks(s))
    assert g.captures == 1
    for it, (a, b) in enumerate(zip(got_masks, want_masks)):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"iteration {it}: {name}")
    for name in got_masks[0]:  # fresh masks after the capture
        assert not np.array_equal(got_masks[-1][name], got_masks[-2][name]), name
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for le, lg in zip([x for x in eager.net.layers if x.type == "Dropout"], drops):
        assert lg.state_dict() == le.state_dict() and lg.state_dict()["counter"] == 6
    for pg, pe in zip(_params(s), _params(eager)):
        assert _rel(pg, pe) <= 1e-5
