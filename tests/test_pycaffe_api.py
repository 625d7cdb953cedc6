"""pycaffe's Net and Solver API points that scripts written for BVLC Caffe use (found by
running such scripts against minicaffe): a Python layer's own methods through
``net.layers``, ``set_input_arrays``, ``share_with``, ``backward(end=)``, the typed solver
classes, and ``import caffe`` once minicaffe is loaded."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, parse_text

TINY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "r" }
layer { name: "ip2" type: "InnerProduct" bottom: "r" top: "out"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
"""


def net(text=TINY, phase=caffe.TEST):
    return caffe.Net(parse_text(text, caffe_pb2.NetParameter), phase)


def test_a_python_layers_own_methods_through_net_layers():
    n = net('name: "p" layer { name: "rows" type: "Python" top: "rows" '
            'python_param { module: "pylayers_example" layer: "RoidbLayer" } }')
    n.layers[0].set_rows([3.0, 5.0, 7.0])          # py-faster-rcnn's set_roidb pattern
    assert n.layers[0].rows == [3.0, 5.0, 7.0]
    n.forward()
    np.testing.assert_array_equal(n.blobs["rows"].data[:, 0], [3, 5, 7])
    with pytest.raises(AttributeError):
        n.layers[0].no_such_method


def test_set_input_arrays_feeds_the_first_memory_data_layer():
    text = ('name: "m" layer { name: "mem" type: "MemoryData" top: "data" top: "label" '
            'memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }')
    n = net(text, caffe.TRAIN)
    x = np.arange(16, dtype=np.float32).reshape(4, 1, 2, 2)
    n.set_input_arrays(x, np.arange(4, dtype=np.float32))
    n.forward()
    np.testing.assert_array_equal(n.blobs["data"].data, x[:2])
    assert n.blobs["label"].data.shape == (2, 1, 1, 1)   # as Caffe's MemoryData forward
    np.testing.assert_array_equal(n.blobs["label"].data.ravel(), [0, 1])
    with pytest.raises(RuntimeError, match="first layer is a MemoryData layer"):
        net().set_input_arrays(x, np.arange(4, dtype=np.float32))


def test_share_with_shares_the_weights_by_layer_name():
    a, b = net(), net()
    b.share_with(a)
    a.params["ip1"][0].data[...] = 0.25
    np.testing.assert_array_equal(b.params["ip1"][0].data, a.params["ip1"][0].data)


def test_backward_with_end_returns_the_bottoms_of_that_layer():
    text = TINY.replace('name: "tiny"', 'name: "tiny" force_backward: true')
    n = net(text, caffe.TRAIN)
    n.forward(data=np.ones((2, 3), np.float32))
    n.blobs["out"].diff[...] = 1
    assert sorted(n.backward()) == ["data"]
    assert sorted(n.backward(end="ip2")) == ["r"]
    assert sorted(n.backward(start="ip2", end="relu", diffs=["out"])) == ["ip1", "out"]


@pytest.mark.parametrize("cls, kind", [
    (caffe.SGDSolver, "SGD"), (caffe.NesterovSolver, "Nesterov"),
    (caffe.AdaGradSolver, "AdaGrad"), (caffe.RMSPropSolver, "RMSProp"),
    (caffe.AdaDeltaSolver, "AdaDelta"), (caffe.AdamSolver, "Adam")])
def test_pycaffes_solver_classes_impose_their_update(tmp_path, cls, kind):
    """Each of pycaffe's solver classes is one C++ solver class: the file's ``type`` does not
    change it (get_solver follows the file)."""
    (tmp_path / "net.prototxt").write_text(TINY.replace(
        "input_param { shape { dim: 2 dim: 3 } } }",
        "input_param { shape { dim: 2 dim: 3 } } }\n"
        'layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 2 dim: 2 } } }')
        + 'layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "t" top: "loss" }')
    other = "Adam" if kind != "Adam" else "SGD"
    momentum = 0.9 if kind in ("SGD", "Nesterov", "Adam") else 0   # Caffe's checks
    (tmp_path / "s.prototxt").write_text(textwrap.dedent(f"""\
        net: "net.prototxt"
        type: "{other}"
        base_lr: 0.01 momentum: {momentum} lr_policy: "fixed" max_iter: 2 display: 0
        solver_mode: CPU snapshot_prefix: "{tmp_path}/s"
        """))
    s = cls(str(tmp_path / "s.prototxt"))
    assert s.type == kind
    s.step(1)
    assert caffe.get_solver(str(tmp_path / "s.prototxt")).type == other


def test_import_caffe_reaches_minicaffe_where_no_caffe_is_installed():
    code = ("import minicaffe, caffe\n"
            "from caffe.proto import caffe_pb2\n"
            "from caffe import layers as L, params as P\n"
            "import caffe.io\n"
            "assert caffe is minicaffe and caffe_pb2.NetParameter and caffe.io.Transformer\n"
            "assert P.Pooling.MAX == 0 and L.Convolution\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_caffe_submodules_are_minicaffes_own_modules():
    """``import caffe.coord_map`` is ``minicaffe.coord_map`` (not a second copy with its own
    exception classes); pycaffe's net_spec and pycaffe module names reach their roles."""
    code = ("import minicaffe, caffe\n"
            "import caffe.coord_map, minicaffe.coord_map, caffe.net_spec, caffe.pycaffe\n"
            "from caffe.net_spec import layers as L, params as P\n"
            "from caffe.coord_map import crop, UndefinedMapException\n"
            "assert caffe.coord_map is minicaffe.coord_map\n"
            "assert UndefinedMapException is minicaffe.coord_map.UndefinedMapException\n"
            "assert caffe.net_spec is minicaffe.netspec and L is minicaffe.netspec.L\n"
            "assert caffe.pycaffe.Net is minicaffe.Net and P.Pooling.MAX == 0\n"
            "try:\n"
            "    import caffe.no_such_module\n"
            "except ImportError:\n"
            "    pass\n"
            "else:\n"
            "    raise AssertionError('caffe.no_such_module imported')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_set_mode_decides_the_solvers_mode_as_in_pycaffe(monkeypatch):
    """pycaffe's solvers never read solver_mode: Caffe::mode (set_mode_cpu/gpu) decides.
    Where neither was called, minicaffe follows the file."""
    from minicaffe import backend, solver as solver_mod

    class Stub:
        param = caffe_pb2.SolverParameter(solver_mode=caffe_pb2.SolverParameter.GPU)

    monkeypatch.setattr(solver_mod, "gpu_available", lambda: True)
    monkeypatch.setitem(backend._default, "explicit", False)
    assert solver_mod.Solver._choose_mode(Stub(), None) == "GPU"
    monkeypatch.setitem(backend._default, "mode", "CPU")
    caffe.set_mode_cpu()
    assert solver_mod.Solver._choose_mode(Stub(), None) == "CPU"
    assert solver_mod.Solver._choose_mode(Stub(), "GPU") == "GPU"     # an explicit argument


SHARED = TINY.replace('name: "ip2" type: "InnerProduct" bottom: "r" top: "out"',
                      'name: "ip2" type: "InnerProduct" bottom: "r" top: "out" '
                      'param { name: "w2" }') + (
    'layer { name: "ip3" type: "InnerProduct" bottom: "r" top: "out3" param { name: "w2" } '
    'inner_product_param { num_output: 2 } }')


def test_hdf5_weights_as_caffes_to_hdf5_and_back(tmp_path):
    """net.save_hdf5 writes Caffe's layout (Net::ToHDF5: data/<layer>/<j> with a group for
    every layer, the inserted Split too; shared params' data by their owner only, their
    diff under every layer); copy_from (pycaffe's Net(..., weights)) recognises an HDF5
    file and loads it."""
    import h5py
    a = net(SHARED)
    a.params["ip1"][0].data[...] = np.arange(12, dtype=np.float32).reshape(4, 3)
    a.params["ip2"][0].diff[...] = 3.0
    path = tmp_path / "w.caffemodel.h5"
    a.save_hdf5(str(path), write_diff=True)
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["data", "diff"]
        assert list(f["data"]) == list(f["diff"]) == sorted(a.layer_names)
        assert {"data", "relu", "ip1", "ip2", "ip3"} < set(f["data"])
        assert len(f["data"]) == 6                   # and relu's Split
        assert len(f["data/relu"]) == 0
        assert sorted(f["data/ip1"]) == ["0", "1"] and f["data/ip1/0"].shape == (4, 3)
        assert sorted(f["data/ip3"]) == ["1"]        # its weights are ip2's
        assert sorted(f["diff/ip3"]) == ["0", "1"]   # Caffe: diffs regardless of sharing
        np.testing.assert_array_equal(f["diff/ip3/0"][...], np.full((2, 4), 3, np.float32))
    b = net(SHARED)
    b.copy_from(str(path))
    for name in ("ip1", "ip2", "ip3"):
        for x, y in zip(a.params[name], b.params[name]):
            np.testing.assert_array_equal(x.data, y.data)
    c = caffe.Net(parse_text(SHARED, caffe_pb2.NetParameter), caffe.TEST)
    c.load_hdf5(str(path))
    np.testing.assert_array_equal(c.params["ip3"][0].data, a.params["ip2"][0].data)


def test_hdf5_weights_that_do_not_fit_name_the_layer(tmp_path):
    import h5py
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip1/0", data=np.zeros((5, 3), np.float32))
    with pytest.raises(ValueError, match=r"layer 'ip1': shape \(5, 3\) in the file, \(4, 3\)"):
        net().copy_from(str(path))
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip1/1", data=np.zeros((4,), np.float32))
    with pytest.raises(ValueError, match="layer 'ip1': no dataset 0"):
        net().copy_from(str(path))
