"""pycaffe's API surface, group by group, against BVLC Caffe's python/caffe sources
(_caffe.cpp, pycaffe.py, io.py, __init__.py): the names the package exports, the raw
``_caffe`` members of Net, Blob, Layer and Solver that pycaffe.py builds on, the checks
and errors of forward/backward/set_input_arrays, the callbacks, Caffe's multi-GPU
settings, Timer, and NCCL as a Caffe built without it has it.  What pycaffe's own unit
tests cover is in tests/pycaffe_spec/; what scripts found is in test_pycaffe_api.py.
"""
from collections import OrderedDict

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import common

NET = """name: "surface" force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "score" type: "InnerProduct" bottom: "ip" top: "score"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss"
        loss_weight: 2 }
"""

SOLVER = """net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" max_iter: 3 display: 0
snapshot_prefix: "snap" snapshot_after_train: false test_iter: 1 test_interval: 100
random_seed: 5
"""


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(NET)
    return caffe.Net(str(path), caffe.TRAIN)


@pytest.fixture
def solver_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.prototxt").write_text(NET)
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    caffe.set_mode_cpu()
    return str(tmp_path / "solver.prototxt")


@pytest.fixture(autouse=True)
def _caffe_settings_restored(monkeypatch):
    monkeypatch.setattr(common, "_state", dict(common._state))


def feed(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"data": rng.standard_normal((2, 3)).astype(np.float32),
            "label": np.array([0, 2], np.float32)}


# ------------------------------------------------------------------ the package
def test_the_package_exports_pycaffes_names():
    """python/caffe/__init__.py's imports, every one."""
    names = ("Net SGDSolver NesterovSolver AdaGradSolver RMSPropSolver AdaDeltaSolver "
             "AdamSolver NCCL Timer init_log log set_mode_cpu set_mode_gpu set_device Layer "
             "get_solver layer_type_list set_random_seed solver_count set_solver_count "
             "solver_rank set_solver_rank set_multiprocess has_nccl __version__ TRAIN TEST "
             "Classifier Detector io layers params NetSpec to_proto").split()
    assert [n for n in names if not hasattr(caffe, n)] == []
    assert (caffe.TRAIN, caffe.TEST) == (0, 1)
    ns = {}
    exec("from minicaffe import *", ns)
    assert {"init_log", "log", "Timer", "NCCL", "has_nccl", "to_proto"} <= set(ns)


def test_log_and_init_log(monkeypatch):
    import io
    from minicaffe import log as log_module
    stream = io.StringIO()
    monkeypatch.setattr(log_module, "_state", {"stream": stream, "quiet": False})
    caffe.init_log()
    caffe.log("first")
    caffe.init_log(1)                 # FLAGS_minloglevel = WARNING: INFO is hidden
    caffe.log("hidden")
    caffe.init_log(0, True)           # init_log(level, stderr), as python/train.py calls it
    caffe.log("third")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("I") and lines[0].endswith("] first")
    assert lines[1].endswith("] third")
    with pytest.raises(ValueError, match="severity"):
        caffe.init_log(7)
    assert log_module.log is not None and callable(caffe.log)   # still the module


def test_multi_gpu_settings_and_nccl_as_a_build_without_it():
    assert (caffe.solver_count(), caffe.solver_rank(), caffe.has_nccl()) == (1, 0, False)
    caffe.set_solver_count(4)
    caffe.set_solver_rank(2)
    caffe.set_multiprocess(True)
    assert (caffe.solver_count(), caffe.solver_rank(), common.multiprocess()) == (4, 2, True)
    nccl = caffe.NCCL(object(), "uid")
    assert not hasattr(caffe.NCCL, "new_uid") and not hasattr(nccl, "bcast")


def test_timer():
    t = caffe.Timer()
    assert t.ms == 0.0                           # never started: Caffe warns and reads 0
    t.start()
    sum(range(10000))
    first = t.ms                                 # stops a running timer first
    assert first > 0 and not t.running and t.ms == first
    t.start()
    t.stop()
    t.stop()                                     # a second stop changes nothing
    assert t.ms >= 0


# ------------------------------------------------------------------------ Net
def test_net_dicts_are_in_the_nets_order(net):
    assert isinstance(net.blobs, OrderedDict)
    assert list(net.blobs) == net._blob_names == ["data", "label", "ip", "score", "loss"]
    assert net._blobs == list(net.blobs.values())
    assert list(net.layer_dict) == net._layer_names == ["data", "ip", "relu", "score", "loss"]
    assert list(net.params) == ["ip", "score"]               # layers with blobs only
    assert [b.data.shape for b in net.params["ip"]] == [(4, 3), (4,)]
    assert net.inputs == ["data", "label"] and net._inputs == [0, 1]
    assert net.outputs == ["loss"] and net._outputs == [4]
    assert net.blob_loss_weights == OrderedDict(
        [("data", 0.0), ("label", 0.0), ("ip", 0.0), ("score", 0.0), ("loss", 2.0)])
    assert net._blob_loss_weights == [0.0, 0.0, 0.0, 0.0, 2.0]
    assert [net._bottom_ids(i) for i in range(5)] == [[], [0], [2], [2], [3, 1]]
    assert [net._top_ids(i) for i in range(5)] == [[0, 1], [2], [2], [3], [4]]
    assert net.top_names["relu"] == ["ip"] and net.bottom_names["loss"] == ["score", "label"]


def test_raw_forward_and_backward_take_layer_indices(net):
    for name, value in feed(net).items():
        net.blobs[name].data[...] = value
    loss = net._forward(0, len(net.layers) - 1)
    # Net::ForwardFromTo sums each loss top times its loss_weight (2 here)
    assert isinstance(loss, float) and loss == pytest.approx(2 * float(net.blobs["loss"].data))
    net._backward(len(net.layers) - 1, 0)
    assert np.any(net.blobs["data"].diff != 0)
    with pytest.raises(IndexError, match="layer index"):
        net._forward(0, 5)


def test_forward_checks_inputs_as_pycaffe(net):
    x = feed(net)
    out = net.forward(**x)
    assert list(out) == ["loss"] and out["loss"] is net.blobs["loss"].data   # no copy
    with pytest.raises(ValueError, match="Input blob arguments do not match net inputs"):
        net.forward(data=x["data"])                               # all inputs, or none
    with pytest.raises(ValueError, match="Input blob arguments do not match"):
        net.forward(ip=np.zeros((2, 4), np.float32), **x)         # a blob, not an input
    with pytest.raises(ValueError, match="Input is not batch sized"):
        net.forward(data=np.zeros((3, 3), np.float32), label=np.zeros(3, np.float32))
    # the rest of the shape broadcasts, as pycaffe's blob.data[...] = array
    net.forward(data=np.ones((2, 1), np.float32), label=x["label"])
    np.testing.assert_array_equal(net.blobs["data"].data, 1)
    with pytest.raises(ValueError, match="does not fit blob 'data'"):
        net.forward(data=np.ones((2, 2), np.float32), label=x["label"])
    with pytest.raises(ValueError, match="has no layer 'nope'"):   # pycaffe: list.index
        net.forward(end="nope")
    assert sorted(net.forward(start="ip", end="relu", blobs=["score"])) == ["ip", "score"]


def test_backward_checks_top_diffs_as_pycaffe(net):
    net.forward(**feed(net))
    # pycaffe's backward(loss=...) fails: the loss top has no axes, so no batch axis (its
    # shape[0] is an IndexError); the loss diff is set through the blob
    with pytest.raises(ValueError, match="Diff is not batch sized"):
        net.backward(loss=np.ones(net.blobs["loss"].shape, np.float32))
    net.blobs["loss"].diff[...] = 1
    grads = net.backward()
    assert sorted(grads) == ["data", "label"]
    with pytest.raises(ValueError, match="Top diff arguments do not match net outputs"):
        net.backward(score=np.ones((2, 3), np.float32))
    assert sorted(net.backward(end="score", diffs=["data"])) == ["data", "ip"]


def test_net_callbacks_run_around_each_layer(net):
    seen = []
    net.before_forward(lambda i: seen.append(("bf", i)))
    net.after_forward(lambda i: seen.append(("af", i)))
    net.before_backward(lambda i: seen.append(("bb", i)))
    net.after_backward(lambda i: seen.append(("ab", i)))
    net.forward(start="ip", end="relu")
    assert seen == [("bf", 1), ("af", 1), ("bf", 2), ("af", 2)]
    seen.clear()
    net.backward(start="relu", end="data")         # the Input layer needs no backward: called
    assert seen == [("bb", 2), ("ab", 2), ("bb", 1), ("ab", 1), ("bb", 0), ("ab", 0)]
    with pytest.raises(TypeError, match="no NCCL"):
        net.after_backward(caffe.NCCL(None, ""))


MEMORY = ('name: "m" layer { name: "mem" type: "MemoryData" top: "data" top: "label" '
          'memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }')


def test_set_input_arrays_checks_as_pycaffe(tmp_path):
    path = tmp_path / "m.prototxt"
    path.write_text(MEMORY)
    n = caffe.Net(str(path), caffe.TRAIN)
    x = np.arange(16, dtype=np.float32).reshape(4, 1, 2, 2)
    n.set_input_arrays(x, np.arange(4, dtype=np.float32))          # 1-d labels made 4-d
    n._set_input_arrays(x, np.zeros((4, 1, 1, 1), np.float32))
    cases = [(x.astype(np.float64), "data array must be float32"),
             (x[:, :, :, ::-1], "data array must be C contiguous"),
             (x.reshape(4, 4), "data array must be 4-d"),
             (np.zeros((4, 3, 2, 2), np.float32), "data array has wrong number of channels"),
             (np.zeros((4, 1, 3, 2), np.float32), "data array has wrong height"),
             (np.zeros((4, 1, 2, 3), np.float32), "data array has wrong width"),
             (x[:3].copy(), "same first dimension")]
    for data, message in cases:
        with pytest.raises(RuntimeError, match=message):
            n.set_input_arrays(data, np.arange(4, dtype=np.float32))
    with pytest.raises(RuntimeError, match="labels array must be float32"):
        n.set_input_arrays(x, np.arange(4))
    with pytest.raises(RuntimeError, match="multiple of batch size"):
        n.set_input_arrays(x[:3].copy(), np.arange(3, dtype=np.float32))


# ------------------------------------------------------------------ Blob, Layer
def test_blob_and_layer_members(net):
    blob = net.blobs["data"]
    assert tuple(blob.shape) == (2, 3) and blob.count == 6
    assert (blob.num, blob.channels, blob.height, blob.width) == (2, 3, 1, 1)   # 1-padded
    assert blob.data.dtype == np.float32 and blob.diff.shape == (2, 3)
    blob.reshape(4, 3)
    assert blob.data.shape == (4, 3)
    layer = net.layers[1]
    assert layer.type == "InnerProduct" and len(layer.blobs) == 2
    assert net.layer_dict["ip"] is layer and net.params["ip"] is layer.blobs


# --------------------------------------------------------------------- Solver
def test_solver_members_callbacks_and_share_weights(solver_file):
    s = caffe.SGDSolver(solver_file)
    assert s.iter == 0 and isinstance(s.net, caffe.Net) and len(s.test_nets) == 1
    assert s.param.max_iter == 3 and s.param.display == 0
    calls = []
    s.add_callback(lambda: calls.append("start"), lambda: calls.append("ready"))
    s.step(2)
    assert calls == ["start", "ready"] * 2 and s.iter == 2
    with pytest.raises(TypeError, match="NCCL"):
        s.add_callback(caffe.NCCL(s, ""))
    other = caffe.Net("net.prototxt", caffe.TEST)
    s.share_weights(other)
    s.net.params["ip"][0].data[...] = 0.5
    np.testing.assert_array_equal(other.params["ip"][0].data, 0.5)
    s.solve()
    assert s.iter == 3


def test_a_solver_of_rank_1_neither_tests_nor_snapshots(solver_file, tmp_path):
    caffe.set_solver_count(2)
    caffe.set_solver_rank(1)
    caffe.set_multiprocess(True)
    s = caffe.SGDSolver(solver_file)
    assert s.test_nets == []                     # Solver::Init: test nets on the root only
    assert caffe.rng.current_seed() == 6         # random_seed + rank
    s.step(1)
    with pytest.raises(RuntimeError, match="root solver"):
        s.snapshot()
    assert not list(tmp_path.glob("snap_iter_*"))


def test_python_layers_refuse_several_solvers_in_one_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    text = ('name: "p" layer { name: "rows" type: "Python" top: "rows" '
            'python_param { module: "pylayers_example" layer: "RoidbLayer" } }')
    path = tmp_path / "p.prototxt"
    path.write_text(text)
    caffe.set_solver_count(2)
    with pytest.raises(RuntimeError, match="use train.py"):
        caffe.Net(str(path), caffe.TRAIN)
    caffe.Net(str(path), caffe.TEST)             # TEST nets are not refused
    caffe.set_multiprocess(True)
    caffe.Net(str(path), caffe.TRAIN)            # one solver per process: as train.py


# ------------------------------------------------------------------------ io
def test_io_blobprotovector_round_trip():
    arrays = [np.arange(6, dtype=np.float32).reshape(1, 2, 3), np.ones((4,), np.float32)]
    s = caffe.io.arraylist_to_blobprotovector_str(arrays)
    assert isinstance(s, bytes)
    vec = caffe.caffe_pb2.BlobProtoVector.FromString(s)
    assert [list(b.shape.dim) for b in vec.blobs] == [[1, 2, 3], [4]]
    back = caffe.io.blobprotovector_str_to_arraylist(s)
    assert len(back) == 2
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)


def test_io_datum_and_blobproto_conversions():
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    d = caffe.io.array_to_datum(a, label=7)
    assert (d.channels, d.height, d.width, d.label) == (2, 3, 4, 7) and d.data == a.tobytes()
    np.testing.assert_array_equal(caffe.io.datum_to_array(d), a)
    f = caffe.io.array_to_datum(a.astype(np.float32))
    assert not f.data and list(f.float_data) == list(range(24))
    with pytest.raises(ValueError):
        caffe.io.array_to_datum(np.zeros((1, 1, 2, 2)))
    p = caffe.io.array_to_blobproto(a.astype(np.float32), diff=-a.astype(np.float32))
    np.testing.assert_array_equal(caffe.io.blobproto_to_array(p, return_diff=True),
                                  -a.astype(np.float32))
