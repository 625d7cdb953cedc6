"""Realistic user mistakes: each gets one clear error that names the file, the line, the layer
or the blob (the product rule), through pycaffe's API and through the `minicaffe` command (exit
1, one line, no traceback); a run that dies mid-snapshot leaves the last complete pair."""
import glob
import os
import sys

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import io as mio
from minicaffe.cli import main

DUMMY = """layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: LABEL } } }
"""
TAIL = """layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
POOL = ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" '
        'pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n')


def net(body="", head=DUMMY, label=1, tail=TAIL):
    """A net whose head spans lines 2-4; ``body`` starts at line 5."""
    return 'name: "t"\n' + head.replace("LABEL", str(label)) + body + tail


def data_head(extra="", src="db", backend="LMDB"):
    return (f'layer {{ name: "data" type: "Data" top: "data" top: "label"\n'
            f'  data_param {{ source: "{src}" batch_size: 2 backend: {backend} }} {extra} }}\n')


def layer(text):
    return f"layer {{ {text} }}\n"


# (case, net text, what to do, substrings the message must hold); layers start at line 5
NETS = [
    ("missing brace", net('layer { name: "r" type: "ReLU" bottom: "data" top: "data"\n'), "net",
     ["n.prototxt:6:1", "layer 'r' that opens at line 5 is missing its closing"]),
    ("unknown field", net(layer('name: "r" type: "ReLU" bottom: "data" top: "data" relu_parm { }')),
     "net", ["n.prototxt:5:", '"relu_parm"', 'did you mean "relu_param"']),
    ("enum typo", net(layer('name: "p" type: "Pooling" bottom: "data" top: "q" '
                            'pooling_param { pool: MAXX kernel_size: 2 }')),
     "net", ["n.prototxt:5:", "MAXX", "MAX, AVE, STOCHASTIC"]),
    ("string for a number", net(layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
                                      'convolution_param { num_output: "four" }')),
     "net", ["n.prototxt:5:", '"four"']),
    ("unknown type", net(layer('name: "c" type: "Convolutoin" bottom: "data" top: "c"')), "net",
     ["n.prototxt:5:", "'c'", "'Convolutoin'", "Convolution"]),
    ("unknown bottom", net(layer('name: "r" type: "ReLU" bottom: "dta" top: "r"')), "net",
     ["n.prototxt:5:", "layer 'r'", "'dta'"]),
    ("top of two layers", net(layer('name: "r1" type: "ReLU" bottom: "data" top: "x"')
                              + layer('name: "r2" type: "ReLU" bottom: "data" top: "x"')),
     "net", ["n.prototxt:6:", "layer 'r2'", "'x'", "'r1'"]),
    ("TRAIN-only producer", net(layer('name: "r1" type: "ReLU" bottom: "data" top: "x" '
                                      'include { phase: TRAIN }')
                                + layer('name: "r2" type: "Sigmoid" bottom: "x" top: "y"')),
     "net", ["n.prototxt:6:", "layer 'r2'", "'x'"]),
    ("Eltwise shapes", net(POOL + layer('name: "e" type: "Eltwise" bottom: "data" bottom: "p" '
                                        'top: "e"')),
     "net", ["n.prototxt:6:", "layer 'e'", "'data' has shape (2, 3, 8, 8)", "(2, 3, 4, 4)"]),
    ("Concat shapes", net(POOL + layer('name: "cc" type: "Concat" bottom: "data" bottom: "p" '
                                       'top: "cc"')),
     "net", ["n.prototxt:6:", "layer 'cc'", "'data'", "'p'"]),
    ("Crop bigger than input", net(POOL + layer('name: "cr" type: "Crop" bottom: "p" '
                                                'bottom: "data" top: "cr"')),
     "net", ["n.prototxt:6:", "layer 'cr'", "'p'", "'data'"]),
    ("kernel > padded input", net(layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
                                        'convolution_param { num_output: 4 kernel_size: 11 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "'data'", "8x8"]),
    ("stride 0", net(layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
                           'convolution_param { num_output: 4 kernel_size: 3 stride: 0 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "stride"]),
    ("group does not divide", net(layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
                                        'convolution_param { num_output: 4 kernel_size: 3 '
                                        'group: 2 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "'data'", "group 2"]),
    ("num_output missing", net(layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
                                     'convolution_param { kernel_size: 3 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "num_output"]),
    ("label out of range", net(label=7), "forward",
     ["n.prototxt:7:", "layer 'loss'", "label 7", "'label'", "0 to 2"]),
    ("label NaN", net(label="nan"), "forward",
     ["n.prototxt:7:", "layer 'loss'", "label nan", "'label'"]),
    ("Data source missing", net(head=data_head(src="nodb")), "net",
     ["n.prototxt:2:", "layer 'data'", "'nodb' not found"]),
    ("Data source empty", net(head=data_head(src="empty")), "net",
     ["n.prototxt:2:", "layer 'data'", "empty holds no records"]),
    ("LEVELDB for an LMDB", net(head=data_head(backend="LEVELDB")), "net",
     ["n.prototxt:2:", "layer 'data'", "backend: LMDB"]),
    ("mean_file shape", net(head=data_head('transform_param { mean_file: "mean.binaryproto" }')),
     "net", ["n.prototxt:2:", "layer 'data'", "'mean.binaryproto'", "(3, 5, 5)", "(3, 8, 8)"]),
    ("crop_size > image", net(head=data_head("transform_param { crop_size: 20 }")), "net",
     ["n.prototxt:2:", "layer 'data'", "crop_size 20"]),
    ("ImageData image missing", net(head=layer('name: "data" type: "ImageData" top: "data" '
                                               'top: "label" image_data_param { '
                                               'source: "list.txt" batch_size: 2 }')),
     "forward2", ["n.prototxt:2:", "layer 'data'", "list.txt", "'missing.png' not found"]),
    ("HDF5 file missing", net(head=layer('name: "data" type: "HDF5Data" top: "data" top: "label" '
                                         'hdf5_data_param { source: "h5.txt" batch_size: 2 }')),
     "net", ["n.prototxt:2:", "layer 'data'", "'nothere.h5' not found"]),
    ("Python module missing", net(layer('name: "py" type: "Python" bottom: "data" top: "py" '
                                        'python_param { module: "no_such_mod" layer: "L" }')),
     "net", ["n.prototxt:5:", "layer 'py'", "'no_such_mod'"]),
    ("Python class missing", net(layer('name: "py" type: "Python" bottom: "data" top: "py" '
                                       'python_param { module: "bad_input_mod" layer: "Nope" }')),
     "net", ["n.prototxt:5:", "layer 'py'", "'Nope'"]),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working directory, with the data files the cases name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    with mio.LMDBWriter(str(tmp_path / "db")) as w:
        for i in range(4):
            img = rng.integers(0, 255, (3, 8, 8)).astype(np.uint8)
            w.put(f"{i:08d}".encode(), mio.array_to_datum(img, i % 3).SerializeToString())
    mio.LMDBWriter(str(tmp_path / "empty")).close()
    mio.save_mean_file(str(tmp_path / "mean.binaryproto"), np.zeros((3, 5, 5), np.float32))
    from PIL import Image
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "list.txt").write_text("a.png 0\nmissing.png 1\n")
    (tmp_path / "h5.txt").write_text("nothere.h5\n")
    (tmp_path / "bad_input_mod.py").write_text("import minicaffe as caffe\n"
                                               "class L(caffe.Layer):\n    pass\n")
    yield tmp_path
    sys.modules.pop("bad_input_mod", None)


def message(exc_info):
    return str(exc_info.value)


@pytest.mark.parametrize("case,text,action,expected", NETS, ids=[c[0] for c in NETS])
def test_a_bad_net_names_where(workdir, capsys, case, text, action, expected):
    (workdir / "n.prototxt").write_text(text)
    with pytest.raises(Exception) as e:
        n = caffe.Net("n.prototxt", caffe.TEST)
        for _ in range({"net": 0, "forward": 1, "forward2": 2}[action]):
            n.forward()
    for part in expected:
        assert part in message(e), (part, message(e))
    # the command line: exit 1, one line with the same place, no traceback
    sys.modules.pop("bad_input_mod", None)
    iterations = {"net": 1, "forward": 1, "forward2": 2}[action]
    assert main(["test", "-model", "n.prototxt", "-iterations", str(iterations)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected[0] in err.strip().splitlines()[-1]


def test_inner_product_after_its_bottom_is_reshaped(workdir):
    (workdir / "n.prototxt").write_text(
        'layer { name: "data" type: "Input" top: "data" '
        'input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        'inner_product_param { num_output: 3 } }\n')
    n = caffe.Net("n.prototxt", caffe.TEST)
    n.blobs["data"].reshape(2, 3, 10, 10)
    with pytest.raises(ValueError, match=r"n\.prototxt:2: layer 'ip'.*'data' of shape "
                                         r"\(2, 3, 10, 10\).*300.*192"):
        n.forward()


SOLVER = ('{net}\nbase_lr: 0.01\nmax_iter: 2\nlr_policy: "fixed"\nsolver_mode: CPU\n'
          'snapshot_prefix: "snap/s"\n{extra}\n')
SOLVERS = [
    ("net file missing", 'net: "nonet.prototxt"', "",
     ["s.prototxt: net: File not found: nonet.prototxt"]),
    ("test_iter with no test net", 'train_net: "n.prototxt"', "test_iter: 2\ntest_interval: 1",
     ["s.prototxt: test_iter must be specified for each test network", "train_net"]),
    ("test_net with no test_iter", 'train_net: "n.prototxt"',
     'test_net: "n.prototxt"\ntest_interval: 1',
     ["s.prototxt: test_iter must be specified for each test network"]),
    ("unknown lr_policy", 'net: "n.prototxt"', 'lr_policy: "stepp"',
     ["s.prototxt: Unknown learning rate policy: stepp"]),
    ("solver type typo", 'net: "n.prototxt"', 'type: "SGDD"', ["s.prototxt", "'SGDD'", "Nesterov"]),
    ("snapshot folder is a file", 'net: "n.prototxt"', 'snapshot: 1\nsnapshot_prefix: "afile/s"',
     ["s.prototxt: Cannot write to snapshot prefix 'afile/s'", "not a directory"]),
]


@pytest.mark.parametrize("case,netline,extra,expected", SOLVERS, ids=[c[0] for c in SOLVERS])
def test_a_bad_solver_names_the_file(workdir, capsys, case, netline, extra, expected):
    (workdir / "n.prototxt").write_text(net())
    (workdir / "afile").write_text("x")
    text = SOLVER.format(net=netline, extra=extra)
    if "lr_policy" in extra:
        text = text.replace('lr_policy: "fixed"\n', "")
    if "snapshot_prefix" in extra:
        text = text.replace('snapshot_prefix: "snap/s"\n', "")
    (workdir / "s.prototxt").write_text(text)
    with pytest.raises(Exception) as e:
        caffe.get_solver("s.prototxt")
    for part in expected:
        assert part in message(e), (part, message(e))
    # the command line: exit 1, the same words on one line, no traceback
    assert main(["train", "-solver", "s.prototxt"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected[0] in err.strip().splitlines()[-1]


def _trained(workdir, prefix, num_output=3, iters=1):
    """A solver state and model of a net whose 'ip' has ``num_output`` outputs."""
    (workdir / f"{prefix}.prototxt").write_text(net().replace("num_output: 3",
                                                              f"num_output: {num_output}"))
    (workdir / f"{prefix}_s.prototxt").write_text(
        f'net: "{prefix}.prototxt"\nbase_lr: 0.01\nmax_iter: {iters}\nlr_policy: "fixed"\n'
        f'momentum: 0.9\nsnapshot_prefix: "{prefix}"\n')
    solver = caffe.get_solver(f"{prefix}_s.prototxt")
    solver.solve()
    return solver


WEIGHTS = [
    ("not a caffemodel", "test", ["junk.caffemodel", "not a valid binary caffe.NetParameter"]),
    ("model of another net", "test", ["other_iter_1.caffemodel", "layer 'ip'", "(5, 192)",
                                      "(3, 192)"]),
    ("solverstate of another net", "train", ["other_iter_1.solverstate",
                                             "layer 'ip' param 0", "(3, 192)"]),
]


@pytest.mark.parametrize("case,command,expected", WEIGHTS, ids=[c[0] for c in WEIGHTS])
def test_weights_of_another_net(workdir, capsys, case, command, expected):
    (workdir / "n.prototxt").write_text(net())
    (workdir / "s.prototxt").write_text(SOLVER.format(net='net: "n.prototxt"', extra=""))
    (workdir / "junk.caffemodel").write_text("this is not a model\n" * 4)
    _trained(workdir, "other", num_output=5)
    if command == "test":
        argv = ["test", "-model", "n.prototxt", "-weights", expected[0], "-iterations", "1"]
        call = lambda: caffe.Net("n.prototxt", caffe.TEST, weights=expected[0])  # noqa: E731
    else:
        argv = ["train", "-solver", "s.prototxt", "-snapshot", expected[0]]
        solver = caffe.get_solver("s.prototxt")
        before = solver.net.params["ip"][0].data.copy()
        call = lambda: solver.restore(expected[0])  # noqa: E731
    with pytest.raises(ValueError) as e:
        call()
    for part in expected:
        assert part in message(e), (part, message(e))
    if command == "train":    # a refused state changes nothing
        assert solver.iter == 0 and np.array_equal(solver.net.params["ip"][0].data, before)
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and expected[1] in err.strip().splitlines()[-1]


def _pairs(prefix):
    """{iteration: (caffemodel, solverstate)} of the complete snapshot pairs."""
    out = {}
    for state in glob.glob(f"{prefix}_iter_*.solverstate"):
        it = int(state.rsplit("_iter_", 1)[1].split(".")[0])
        model = f"{prefix}_iter_{it}.caffemodel"
        if os.path.exists(model):
            out[it] = (model, state)
    return out


def test_a_crash_mid_snapshot_keeps_the_last_pair(workdir, monkeypatch):
    """Snapshots go through a temporary name and os.replace: a write that dies (here the
    second solver state) leaves the pair before it whole and loadable, and no file half
    written under a snapshot's name."""
    (workdir / "n.prototxt").write_text(net())
    (workdir / "s.prototxt").write_text(SOLVER.format(net='net: "n.prototxt"',
                                                      extra="snapshot: 2\nmomentum: 0.9")
                                        .replace("max_iter: 2", "max_iter: 6"))
    solver = caffe.get_solver("s.prototxt")
    from minicaffe.proto import text
    real = text.os.replace
    calls = []

    def dying_replace(src, dst):
        calls.append(dst)
        if str(dst).endswith("_iter_4.solverstate"):
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(text.os, "replace", dying_replace)
    with pytest.raises(OSError, match=r"s\.prototxt: Cannot write to snapshot prefix 'snap/s'"):
        solver.solve()
    monkeypatch.setattr(text.os, "replace", real)
    assert sorted(_pairs("snap/s")) == [2]
    assert not glob.glob("snap/.*tmp") and not os.path.exists("snap/s_iter_4.solverstate")
    again = caffe.get_solver("s.prototxt")
    again.restore("snap/s_iter_2.solverstate")
    assert again.iter == 2
    assert np.array_equal(again.net.params["ip"][0].data,
                          caffe.Net("n.prototxt", caffe.TEST, weights="snap/s_iter_2.caffemodel")
                          .params["ip"][0].data)


def test_a_python_layer_that_raises_keeps_the_last_pair(workdir, capsys):
    """An exception from a Python layer at iteration 5 ends `minicaffe train` (exit 1, one
    line naming the layer's file and line); the iteration-4 pair loads."""
    (workdir / "boom.py").write_text(
        "import minicaffe as caffe\n"
        "class Boom(caffe.Layer):\n"
        "    n = 0\n"
        "    def setup(self, bottom, top): pass\n"
        "    def reshape(self, bottom, top): top[0].reshape(*bottom[0].data.shape)\n"
        "    def forward(self, bottom, top):\n"
        "        Boom.n += 1\n"
        "        if Boom.n == 5: raise ValueError('boom at forward 5')\n"
        "        top[0].data[...] = bottom[0].data\n"
        "    def backward(self, top, propagate_down, bottom): pass\n")
    (workdir / "n.prototxt").write_text(net(layer(
        'name: "py" type: "Python" bottom: "data" top: "data2" '
        'python_param { module: "boom" layer: "Boom" }')))
    (workdir / "s.prototxt").write_text(SOLVER.format(net='net: "n.prototxt"', extra="snapshot: 2")
                                        .replace("max_iter: 2", "max_iter: 10"))
    try:
        assert main(["train", "-solver", "s.prototxt"]) == 1
    finally:
        sys.modules.pop("boom", None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ("n.prototxt:5: layer 'py' (type Python): boom at forward 5"
            in err.strip().splitlines()[-1])
    assert sorted(_pairs("snap/s")) == [2, 4]
    caffe.get_solver("s.prototxt").restore("snap/s_iter_4.solverstate")
