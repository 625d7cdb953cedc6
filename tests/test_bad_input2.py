"""A second audit of user mistakes (tests/test_bad_input.py was the first): shapes that do not
fit, layers computed in place that cannot be, rules and param specs written wrong, HDF5 and
mean files of the wrong kind, labels out of range in the other loss layers, solver fields
that Caffe checks late or not at all, pycaffe calls made wrong, and command lines naming
files that are not there.  Each gets one clear error that names the file and line, the
layer, the blob or the flag, through pycaffe's API and through the `minicaffe` command (exit
1, one line, no traceback), and loses nothing; where Caffe runs, minicaffe runs the same way.
"""
import os
import sys

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe import io as mio
from minicaffe.cli import main
from minicaffe.proto import caffe_pb2
from test_bad_input import POOL, layer, net        # the first audit's nets

IP3 = ('layer { name: "ip3" type: "InnerProduct" bottom: "data" top: "ip3" '
       'inner_product_param { num_output: 3 } }\n')


def head(type_, param):
    """A data layer of two tops at line 2."""
    return f'layer {{ name: "data" type: "{type_}" top: "data" top: "label"\n  {param} }}\n'


def lmdb_head(extra="", src="db"):
    return head("Data", f'data_param {{ source: "{src}" batch_size: 2 backend: LMDB }} {extra}')


# (case, net text, what to do, substrings the message must hold); the first is what the
# command line's one line must hold too
NETS = [
    # ---- layers computed in place that cannot be
    ("Reshape in place", net(layer('name: "r" type: "Reshape" bottom: "data" top: "data" '
                                   'reshape_param { shape { dim: 0 dim: -1 } }')),
     "net", ["n.prototxt:5:", "layer 'r'", "does not allow in-place computation"]),
    ("Pooling in place", net(layer('name: "p" type: "Pooling" bottom: "data" top: "data" '
                                   'pooling_param { pool: MAX kernel_size: 2 stride: 2 }')),
     "net", ["n.prototxt:5:", "layer 'p'", "in place", "'data'", "(2, 3, 8, 8)",
             "(2, 3, 4, 4)", "a name of its own"]),
    ("Convolution in place", net(layer('name: "c" type: "Convolution" bottom: "data" '
                                       'top: "data" convolution_param { num_output: 4 '
                                       'kernel_size: 3 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "in place", "(2, 3, 8, 8)", "(2, 4, 6, 6)"]),
    ("Flatten in place", net(layer('name: "f" type: "Flatten" bottom: "data" top: "data"')),
     "net", ["n.prototxt:5:", "layer 'f'", "in-place"]),
    # ---- rules, param specs and propagate_down written wrong
    ("include and exclude", net(layer('name: "r" type: "ReLU" bottom: "data" top: "r" '
                                      'include { phase: TEST } exclude { stage: "x" }')),
     "net", ["n.prototxt:5:", "layer 'r'", "include rules or exclude rules"]),
    ("param spec, no params", net(layer('name: "r" type: "ReLU" bottom: "data" top: "r" '
                                        'param { lr_mult: 0 }')),
     "net", ["n.prototxt:5:", "layer 'r'", "1 param specs given", "0 parameter blobs"]),
    ("propagate_down count", net(layer('name: "r" type: "ReLU" bottom: "data" top: "r" '
                                       'propagate_down: true propagate_down: false')),
     "net", ["n.prototxt:5:", "layer 'r'", "propagate_down has 2 entries"]),
    ("shared param of another shape",
     net(POOL + layer('name: "i1" type: "InnerProduct" bottom: "data" top: "i1" '
                      'param { name: "w" } inner_product_param { num_output: 4 '
                      'bias_term: false }')
         + layer('name: "i2" type: "InnerProduct" bottom: "p" top: "i2" param { name: "w" } '
                 'inner_product_param { num_output: 4 bias_term: false }')),
     "net", ["n.prototxt:7:", "'w'", "layer 'i1'", "layer 'i2'", "(4, 192)", "(4, 48)"]),
    # ---- shapes that do not fit (Caffe's CHECKs; these were right before this audit)
    ("Reshape with two -1", net(layer('name: "r" type: "Reshape" bottom: "data" top: "r" '
                                      'reshape_param { shape { dim: -1 dim: -1 } }')),
     "net", ["n.prototxt:5:", "layer 'r'", "multiple -1"]),
    ("Reshape count not divisible", net(layer('name: "r" type: "Reshape" bottom: "data" '
                                              'top: "r" reshape_param { shape { dim: 0 '
                                              'dim: -1 dim: 5 } }')),
     "net", ["n.prototxt:5:", "layer 'r'", "divisible", "(2, 3, 8, 8)"]),
    ("Slice points out of order", net(layer('name: "s" type: "Slice" bottom: "data" top: "s1" '
                                            'top: "s2" top: "s3" slice_param { axis: 2 '
                                            'slice_point: 5 slice_point: 3 }')),
     "net", ["n.prototxt:5:", "layer 's'", "slice_point [5, 3]", "increasing"]),
    ("Slice point past the axis", net(layer('name: "s" type: "Slice" bottom: "data" top: "s1" '
                                            'top: "s2" slice_param { axis: 2 slice_point: 9 }')),
     "net", ["n.prototxt:5:", "layer 's'", "slice_point 9", "'data'"]),
    ("Scale by a blob of another shape", net(POOL + layer('name: "s" type: "Scale" '
                                                          'bottom: "data" bottom: "p" top: "s"')),
     "net", ["n.prototxt:6:", "layer 's'", "'data'", "(2, 3, 4, 4)"]),
    ("Bias by a blob of another shape", net(POOL + layer('name: "b" type: "Bias" '
                                                         'bottom: "data" bottom: "p" top: "b"')),
     "net", ["n.prototxt:6:", "layer 'b'", "'data'", "(2, 3, 4, 4)"]),
    ("Deconvolution group", net(layer('name: "d" type: "Deconvolution" bottom: "data" top: "d" '
                                      'convolution_param { num_output: 4 kernel_size: 2 '
                                      'group: 2 }')),
     "net", ["n.prototxt:5:", "layer 'd'", "'data'", "group 2"]),
    ("Pooling window > input", net(layer('name: "p2" type: "Pooling" bottom: "data" top: "p2" '
                                         'pooling_param { pool: AVE kernel_size: 11 }')),
     "net", ["n.prototxt:5:", "layer 'p2'", "'data'", "8x8"]),
    ("kernel_size and kernel_h", net(layer('name: "c" type: "Convolution" bottom: "data" '
                                           'top: "c" convolution_param { num_output: 4 '
                                           'kernel_size: 3 kernel_h: 3 kernel_w: 3 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "not both"]),
    ("Convolution without kernel", net(layer('name: "c" type: "Convolution" bottom: "data" '
                                             'top: "c" convolution_param { num_output: 4 }')),
     "net", ["n.prototxt:5:", "layer 'c'", "kernel_size"]),
    ("InnerProduct without num_output", net(layer('name: "i" type: "InnerProduct" '
                                                  'bottom: "data" top: "i"')),
     "net", ["n.prototxt:5:", "layer 'i'", "num_output"]),
    ("SoftmaxWithLoss label count", net(POOL + layer('name: "l" type: "SoftmaxWithLoss" '
                                                     'bottom: "p" bottom: "label" top: "l"')),
     "net", ["n.prototxt:6:", "layer 'l'", "needs 32 labels", "'label'"]),
    ("Crop offset past the bottom", net(POOL + layer('name: "cr" type: "Crop" bottom: "data" '
                                                     'bottom: "p" top: "cr" crop_param { '
                                                     'axis: 2 offset: 6 }')),
     "net", ["n.prototxt:6:", "layer 'cr'", "offset 6", "'data'"]),
    ("Concat axis out of range", net(layer('name: "cc" type: "Concat" bottom: "data" '
                                           'bottom: "data" top: "cc" concat_param { axis: 5 }')),
     "net", ["n.prototxt:5:", "layer 'cc'", "axis 5", "'data'"]),
    ("Accuracy top_k > classes", net(IP3 + layer('name: "acc" type: "Accuracy" bottom: "ip3" '
                                                 'bottom: "label" top: "acc" '
                                                 'accuracy_param { top_k: 5 }')),
     "net", ["n.prototxt:6:", "layer 'acc'", "top_k (5)", "3"]),
    # ---- labels out of range in the loss layers other than SoftmaxWithLoss
    ("MultinomialLogisticLoss label", net(IP3 + layer('name: "prob" type: "Softmax" '
                                                      'bottom: "ip3" top: "prob"')
                                          + layer('name: "mll" type: "MultinomialLogisticLoss" '
                                                  'bottom: "prob" bottom: "label" top: "mll"'),
                                          label=7, tail=""),
     "forward", ["n.prototxt:7:", "layer 'mll'", "label 7", "'label'", "0 to 2"]),
    ("InfogainLoss label", net(IP3 + layer('name: "ig" type: "InfogainLoss" bottom: "ip3" '
                                           'bottom: "label" top: "ig" '
                                           'infogain_loss_param { source: "H.binaryproto" }'),
                               label=7, tail=""),
     "forward", ["n.prototxt:6:", "layer 'ig'", "label 7", "'label'", "0 to 2"]),
    ("HingeLoss label", net(IP3 + layer('name: "hl" type: "HingeLoss" bottom: "ip3" '
                                        'bottom: "label" top: "hl"'), label=7, tail=""),
     "forward", ["n.prototxt:6:", "layer 'hl'", "label 7", "'label'", "0 to 2"]),
    ("HingeLoss label -1", net(IP3 + layer('name: "hl" type: "HingeLoss" bottom: "ip3" '
                                           'bottom: "label" top: "hl"'), label=-1, tail=""),
     "forward", ["n.prototxt:6:", "layer 'hl'", "label -1", "'label'", "0 to 2"]),
    # ---- data and output files of the wrong kind
    ("HDF5 list names no HDF5 file", net(head=head("HDF5Data", 'hdf5_data_param { '
                                                   'source: "junk_list.txt" batch_size: 2 }')),
     "net", ["n.prototxt:2:", "layer 'data'", "junk.h5", "not an HDF5 file"]),
    ("HDF5 source is the .h5 itself", net(head=head("HDF5Data", 'hdf5_data_param { '
                                                    'source: "ok.h5" batch_size: 2 }')),
     "net", ["n.prototxt:2:", "layer 'data'", "'ok.h5' is an HDF5 file", "lists"]),
    ("HDF5Output folder missing", net(layer('name: "out" type: "HDF5Output" bottom: "data" '
                                            'bottom: "label" hdf5_output_param { '
                                            'file_name: "nodir/out.h5" }')),
     "net", ["n.prototxt:5:", "layer 'out'", "nodir/out.h5"]),
    ("mean_file is a .npy", net(head=lmdb_head('transform_param { mean_file: "mean.npy" }')),
     "net", ["n.prototxt:2:", "layer 'data'", "mean.npy", "NumPy", "array_to_blobproto"]),
    ("mean_value count", net(head=lmdb_head("transform_param { mean_value: 1 mean_value: 2 }")),
     "net", ["n.prototxt:2:", "layer 'data'", "mean_value", "3"]),
    ("Datum of another size", net(head=lmdb_head(src="mixed")), "forward",
     ["n.prototxt:2:", "layer 'data'", "(3, 10, 10)", "(3, 8, 8)"]),
    ("ImageData line without label", net(head=head("ImageData", 'image_data_param { '
                                                   'source: "nolabel.txt" batch_size: 2 }')),
     "net", ["n.prototxt:2:", "layer 'data'", "nolabel.txt:1"]),
    ("root_folder without '/'", net(head=head("ImageData", 'image_data_param { '
                                              'source: "list.txt" root_folder: "imgs" '
                                              'batch_size: 2 }')),
     "net", ["n.prototxt:2:", "layer 'data'", "'imgsa.png' not found", "end it with '/'"]),
    # ---- parameters Caffe's release builds do not check
    ("dropout_ratio 1", net(layer('name: "d" type: "Dropout" bottom: "data" top: "d" '
                                  'dropout_param { dropout_ratio: 1 }')),
     "net", ["n.prototxt:5:", "layer 'd'", "[0, 1)", "got 1.0"]),
    ("Python module as a file name", net(layer('name: "py" type: "Python" bottom: "data" '
                                               'top: "py" python_param { module: "pykey.py" '
                                               'layer: "L" }')),
     "net", ["n.prototxt:5:", "layer 'py'", "'pykey.py' is a file name", 'module: "pykey"']),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working directory, with the data files the cases name."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    for name, sizes in (("db", [8, 8, 8, 8]), ("mixed", [8, 10, 8, 8])):
        with mio.LMDBWriter(str(tmp_path / name)) as w:
            for i, s in enumerate(sizes):
                img = rng.integers(0, 255, (3, s, s)).astype(np.uint8)
                w.put(f"{i:08d}".encode(), mio.array_to_datum(img, i % 3).SerializeToString())
    import h5py
    with h5py.File(tmp_path / "ok.h5", "w") as f:
        f["data"] = np.zeros((4, 3, 8, 8), np.float32)
        f["label"] = np.zeros(4, np.float32)
    (tmp_path / "junk.h5").write_text("this is no HDF5 file\n")
    (tmp_path / "junk_list.txt").write_text("junk.h5\n")
    np.save(tmp_path / "mean.npy", np.zeros((3, 8, 8), np.float32))
    mio.write_blobproto(str(tmp_path / "H.binaryproto"), mio.array_to_blobproto(np.eye(3)))
    from PIL import Image
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "nolabel.txt").write_text("a.png\na.png\n")
    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "imgs" / "a.png")
    (tmp_path / "list.txt").write_text("a.png 0\na.png 1\n")
    (tmp_path / "pykey.py").write_text(
        "import minicaffe as caffe\n"
        "class L(caffe.Layer):\n"
        "    def setup(self, bottom, top):\n"
        "        self.batch_size = eval(self.param_str)['batch_size']\n"
        "    def reshape(self, bottom, top): top[0].reshape(1)\n"
        "    def forward(self, bottom, top): pass\n")
    yield tmp_path
    sys.modules.pop("pykey", None)


def one_line(capsys):
    """The last line the command wrote to stderr, after checking it wrote no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("case,text,action,expected", NETS, ids=[c[0] for c in NETS])
def test_a_bad_net_names_where(workdir, capsys, case, text, action, expected):
    (workdir / "n.prototxt").write_text(text)
    with pytest.raises(Exception) as e:
        n = caffe.Net("n.prototxt", caffe.TEST)
        if action == "forward":
            n.forward()
    for part in expected:
        assert part in str(e.value), (part, str(e.value))
    # the command line: exit 1, one line with the same place, no traceback
    capsys.readouterr()
    assert main(["test", "-model", "n.prototxt", "-iterations", "1"]) == 1
    assert expected[0] in one_line(capsys)


def test_in_place_layers_that_keep_the_shape_still_run(workdir):
    """The in-place check refuses only a top that changes its bottom's shape: ReLU, Dropout,
    BatchNorm and Scale in place (every ResNet) build and run as before."""
    (workdir / "n.prototxt").write_text(net(
        layer('name: "bn" type: "BatchNorm" bottom: "data" top: "data"')
        + layer('name: "sc" type: "Scale" bottom: "data" top: "data" '
                'scale_param { bias_term: true }')
        + layer('name: "r" type: "ReLU" bottom: "data" top: "data"')
        + layer('name: "d" type: "Dropout" bottom: "data" top: "data"')))
    n = caffe.Net("n.prototxt", caffe.TRAIN)
    n.forward()
    n.backward()
    assert n.blobs["data"].shape == (2, 3, 8, 8) and (n.blobs["data"].data >= 0).all()


def test_dropout_ratio_0_runs_as_caffe(workdir):
    """Caffe DCHECKs 0 < dropout_ratio, which its release builds skip: 0 keeps every
    element at scale 1 (turning dropout off in a TRAIN net); minicaffe refused it."""
    (workdir / "n.prototxt").write_text(net(layer(
        'name: "d" type: "Dropout" bottom: "data" top: "d" dropout_param { dropout_ratio: 0 }')))
    n = caffe.Net("n.prototxt", caffe.TRAIN)
    n.forward()
    assert np.array_equal(n.blobs["d"].data, n.blobs["data"].data)


def test_a_python_layer_key_error_names_the_layer(workdir, capsys):
    """A Python layer whose setup reads a key its param_str lacks (the usual
    ``params['batch_size']``): pycaffe gets the KeyError itself, with a note naming the
    layer; the command line's one line says KeyError, the key, the layer and its place."""
    (workdir / "n.prototxt").write_text(net(layer(
        'name: "py" type: "Python" bottom: "data" top: "py" '
        'python_param { module: "pykey" layer: "L" param_str: "{\'bs\': 2}" }')))
    with pytest.raises(KeyError) as e:
        caffe.Net("n.prototxt", caffe.TEST)
    assert "Python layer 'py'" in " ".join(getattr(e.value, "__notes__", []))
    sys.modules.pop("pykey", None)
    assert main(["test", "-model", "n.prototxt", "-iterations", "1"]) == 1
    line = one_line(capsys)
    for part in ("n.prototxt:5:", "KeyError", "'batch_size'", "setup()", "Python layer 'py'"):
        assert part in line, (part, line)


# ------------------------------------------------------------------------ solvers
SOLVER = ('net: "n.prototxt"\nbase_lr: 0.01\nmax_iter: 2\nlr_policy: "fixed"\nsolver_mode: CPU\n'
          'snapshot_prefix: "snap/s"\n{extra}\n')


def _solver_text(extra):
    """The solver with ``extra`` lines; an lr_policy there replaces "fixed"."""
    text = SOLVER.format(extra=extra)
    return text.replace('lr_policy: "fixed"\n', "", 1) if "lr_policy" in extra else text


SOLVERS = [
    ("regularization typo", 'regularization_type: "L3"\nweight_decay: 0.1',
     ["s.prototxt", "Unknown regularization type: L3", "L1, L2"]),
    ("iter_size 0", "iter_size: 0", ["s.prototxt", "iter_size", "got 0"]),
    ("iter_size negative", "iter_size: -2", ["s.prototxt", "iter_size", "got -2"]),
    ("momentum on AdaGrad", 'type: "AdaGrad"\nmomentum: 0.9', ["s.prototxt", "AdaGrad"]),
    ("step without stepsize", 'lr_policy: "step"\ngamma: 0.1', ["s.prototxt", "stepsize"]),
    ("test_iter without test_interval", "test_iter: 1", ["s.prototxt", "test_interval"]),
]


@pytest.mark.parametrize("case,extra,expected", SOLVERS, ids=[c[0] for c in SOLVERS])
def test_a_bad_solver_names_the_file_before_training(workdir, capsys, case, extra, expected):
    """Caught when the solver is built: nothing has run, nothing is written."""
    (workdir / "n.prototxt").write_text(net())
    (workdir / "s.prototxt").write_text(_solver_text(extra))
    with pytest.raises(ValueError) as e:
        caffe.get_solver("s.prototxt")
    for part in expected:
        assert part in str(e.value), (part, str(e.value))
    capsys.readouterr()
    assert main(["train", "-solver", "s.prototxt"]) == 1
    line = one_line(capsys)
    assert expected[0] in line and expected[1] in line
    assert not os.path.exists("snap")


def _solver(workdir, extra=""):
    (workdir / "n.prototxt").write_text(net())
    (workdir / "s.prototxt").write_text(_solver_text(extra))
    return caffe.get_solver("s.prototxt")


def test_multistep_values_out_of_order_run_as_caffe(workdir):
    """Caffe does not check that stepvalue increases: GetLearningRate moves one step when
    iter reaches the next stepvalue, so 5 then 3 steps down at 5 and again at 6."""
    s = _solver(workdir, 'lr_policy: "multistep"\ngamma: 0.1\nstepvalue: 5\nstepvalue: 3')
    rates = []
    for it in range(8):
        s.iter = it
        rates.append(s.get_learning_rate())
    assert np.allclose(rates, [0.01] * 5 + [0.001, 0.0001, 0.0001])


def test_fields_caffe_ignores_or_defaults_run_as_caffe(workdir):
    """delta on SGD is ignored (only AdaGrad, RMSProp, AdaDelta and Adam read it); an unknown
    regularization_type without weight_decay is never read; a solver without max_iter (0)
    trains no iteration and snapshots iteration 0; step(-1) runs nothing (Solver::Step's
    loop does not start)."""
    s = _solver(workdir, 'delta: 1e-6\nregularization_type: "L3"')
    s.step(1)
    assert s.iter == 1
    (workdir / "s.prototxt").write_text(SOLVER.format(extra="").replace("max_iter: 2\n", ""))
    s = caffe.get_solver("s.prototxt")
    before = s.net.params["ip"][0].data.copy()
    s.solve()
    assert s.iter == 0 and os.path.exists("snap/s_iter_0.caffemodel")
    s.step(-1)
    assert s.iter == 0 and np.array_equal(s.net.params["ip"][0].data, before)


@pytest.mark.parametrize("iters", [1.5, "10", None])
def test_step_takes_an_int(workdir, iters):
    """pycaffe's solver.step(int): a float, a string or None is refused before anything
    runs (a float would have run its ceiling, a string failed inside the loop)."""
    s = _solver(workdir)
    with pytest.raises(TypeError, match=r"solver\.step\(iters\) takes an int.*"
                                        + repr(iters).replace(".", r"\.")):
        s.step(iters)
    assert s.iter == 0
    s.step(np.int64(1))     # a NumPy int is an int
    assert s.iter == 1


def test_restore_without_its_caffemodel_changes_nothing(workdir, capsys):
    """A .solverstate whose .caffemodel is gone (copied without it): the error names both
    files; the solver is left as it was; the command line says it on one line."""
    s = _solver(workdir)
    s.solve()
    os.remove("snap/s_iter_2.caffemodel")
    s2 = caffe.get_solver("s.prototxt")
    before = s2.net.params["ip"][0].data.copy()
    with pytest.raises(FileNotFoundError) as e:
        s2.restore("snap/s_iter_2.solverstate")
    for part in ("snap/s_iter_2.solverstate", "learned_net", "snap/s_iter_2.caffemodel"):
        assert part in str(e.value), (part, str(e.value))
    assert s2.iter == 0 and np.array_equal(s2.net.params["ip"][0].data, before)
    capsys.readouterr()
    assert main(["train", "-solver", "s.prototxt", "-snapshot", "snap/s_iter_2.solverstate"]) == 1
    assert "snap/s_iter_2.caffemodel" in one_line(capsys)


def test_weights_flag_naming_a_missing_model(workdir, capsys):
    """-weights a,b with b missing: the flag is named (not the solver file, which has no
    weights), before a is copied."""
    s = _solver(workdir)
    s.net.save("a.caffemodel")
    capsys.readouterr()
    assert main(["train", "-solver", "s.prototxt", "-weights", "a.caffemodel,b.caffemodel"]) == 1
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "-weights: File not found: b.caffemodel" in line and "s.prototxt" not in line
    assert "Finetuning from a.caffemodel" not in err
    # the solver file's own `weights: "a,b"`: its file and field named, before a is copied
    (workdir / "s.prototxt").write_text(_solver_text('weights: "a.caffemodel,b.caffemodel"'))
    assert main(["train", "-solver", "s.prototxt"]) == 1
    err = capsys.readouterr().err
    assert "s.prototxt: weights: File not found: b.caffemodel" in err.strip().splitlines()[-1]
    assert "Finetuning from a.caffemodel" not in err


# ------------------------------------------------------------------------ pycaffe
INPUT = ('name: "t"\nlayer { name: "data" type: "Input" top: "data" '
         'input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }\n'
         'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
         'inner_product_param { num_output: 3 } }\n')


@pytest.fixture
def input_net(workdir):
    (workdir / "n.prototxt").write_text(INPUT)
    return caffe.Net("n.prototxt", caffe.TEST)


def test_net_given_weights_where_the_phase_goes(input_net):
    """caffe.Net(model, weights) without the phase: pycaffe refuses it (ArgumentError, a
    TypeError); protobuf's 'unknown enum label' named nothing.  Both of pycaffe's orders
    with a phase load the weights."""
    input_net.params["ip"][0].data[...] = 7
    input_net.save("w.caffemodel")
    with pytest.raises(TypeError, match=r"phase 'w\.caffemodel' is no phase.*weights="):
        caffe.Net("n.prototxt", "w.caffemodel")
    for args in (("w.caffemodel", caffe.TEST), (caffe.TEST, "w.caffemodel")):
        assert caffe.Net("n.prototxt", *args).params["ip"][0].data[0, 0] == 7


def test_save_into_a_missing_folder_names_the_file(input_net):
    with pytest.raises(FileNotFoundError) as e:
        input_net.save("nodir/w.caffemodel")
    assert "nodir/w.caffemodel" in str(e.value) and ".tmp" not in str(e.value)
    assert "nodir" in str(e.value) and not os.path.exists("nodir")


def test_params_index_past_the_layers_params(input_net):
    """net.params['ip'][2] (an InnerProduct has weights and bias): an IndexError, as
    pycaffe's, that names the layer and what it has."""
    with pytest.raises(IndexError, match=r"layer 'ip' has 2 param blobs.*\(3, 192\).*\(3,\)"):
        input_net.params["ip"][2]
    w, b = input_net.params["ip"]       # the list still behaves as one
    assert w.shape == (3, 192) and input_net.params["ip"][-1] is b


def test_a_name_the_net_lacks(input_net):
    """net.blobs, net.params and net.layer_dict: a KeyError, as pycaffe's, naming the net's
    names (a typo, or a layer without params such as a ReLU)."""
    with pytest.raises(KeyError, match=r"net 't' has no blob 'conv1'.*its blobs: data, ip"):
        input_net.blobs["conv1"]
    with pytest.raises(KeyError, match=r"no layer with params 'data'.*with params: ip\)"):
        input_net.params["data"]
    with pytest.raises(KeyError, match=r"no layer 'ip2'.*its layers: data, ip"):
        input_net.layer_dict["ip2"]


def test_blob_reshape_to_a_fraction(input_net):
    """blob.reshape(1, 3, h / 2, w / 2): pycaffe takes ints only; 8.5 was cut to 8 without a
    word.  A whole float still works."""
    with pytest.raises(TypeError, match=r"blob 'data'.*8\.5.*h // 2"):
        input_net.blobs["data"].reshape(2, 3, 8.5, 8)
    assert input_net.blobs["data"].shape == (2, 3, 8, 8)
    input_net.blobs["data"].reshape(1, 3, 16 / 2, 8)
    assert input_net.blobs["data"].shape == (1, 3, 8, 8)


def test_blob_data_set_from_an_array_of_another_shape(input_net):
    """``blob.data = image`` (minicaffe writes it into the blob): one of another shape names
    the blob and both shapes, where NumPy's broadcast error named neither blob."""
    with pytest.raises(ValueError, match=r"blob 'data'.*\(2, 3, 8, 8\).*\(8, 8, 3\).*reshape"):
        input_net.blobs["data"].data = np.zeros((8, 8, 3))
    input_net.blobs["data"].data = np.ones((3, 8, 8))     # broadcasts, as blob.data[...] =
    assert input_net.blobs["data"].data.all()


def test_transformer_given_a_chw_image(input_net):
    """Transformer.preprocess takes (H, W, K), as caffe.io.load_image gives; a (K, H, W)
    array (an image already transposed) is refused naming both shapes, where pycaffe resized
    it as (H, W) = (K, H) and failed later at the net's input (or, with a channel swap,
    picked three rows' planes as channels without a word)."""
    t = caffe.io.Transformer({"data": input_net.blobs["data"].data.shape})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    with pytest.raises(ValueError, match=r"\(3, 8, 8\) has 8 channels.*takes 3.*\(H, W, K\)"):
        t.preprocess("data", np.zeros((3, 8, 8)))
    assert t.preprocess("data", np.zeros((8, 8, 3))).shape == (3, 8, 8)
    with pytest.raises(ValueError, match=r"\(8, 8, 1\) has 1 channels.*takes 3"):
        t.preprocess("data", np.zeros((8, 8, 1)))      # a grey image, channels swapped
    t = caffe.io.Transformer({"data": input_net.blobs["data"].data.shape})
    t.set_transpose("data", (2, 0, 1))
    assert t.preprocess("data", np.zeros((8, 8, 1))).shape == (1, 8, 8)   # it broadcasts


def test_forward_asked_for_an_unknown_blob(input_net):
    """forward(blobs=['nope']): refused, naming the net's blobs, before anything runs."""
    input_net.blobs["data"].data[...] = 1
    with pytest.raises(KeyError, match=r"no blob 'nope'.*data, ip"):
        input_net.forward(blobs=["nope"])
    assert not input_net.blobs["ip"].data.any()
    with pytest.raises(KeyError, match=r"no blob 'nope'"):
        input_net.backward(diffs=["nope"])


def test_forward_of_a_wrong_shape_or_unknown_layer(input_net):
    """(right before this audit) net.forward(data=array of another shape) names the blob and
    both shapes; forward(start='x') names the net's layers."""
    with pytest.raises(ValueError, match=r"\(2, 3, 9, 9\).*'data'.*\(2, 3, 8, 8\)"):
        input_net.forward(data=np.zeros((2, 3, 9, 9)))
    with pytest.raises(ValueError, match=r"no layer 'conv1'.*data, ip"):
        input_net.forward(start="conv1")


def test_datum_to_array_of_the_raw_bytes(workdir):
    """caffe.io.datum_to_array(value) with the LMDB value as read, not parsed."""
    raw = mio.array_to_datum(np.zeros((3, 4, 4), np.uint8), 1).SerializeToString()
    with pytest.raises(TypeError, match=r"caffe_pb2\.Datum.*bytes.*ParseFromString"):
        caffe.io.datum_to_array(raw)
    datum = caffe_pb2.Datum()
    datum.ParseFromString(raw)
    assert caffe.io.datum_to_array(datum).shape == (3, 4, 4)


def test_blobproto_to_array_of_a_path(workdir):
    """caffe.io.blobproto_to_array('mean.binaryproto'): the path, not the parsed proto."""
    mio.save_mean_file("mean.binaryproto", np.zeros((3, 4, 4), np.float32))
    with pytest.raises(TypeError, match=r"BlobProto.*'mean\.binaryproto'.*ParseFromString"):
        caffe.io.blobproto_to_array("mean.binaryproto")
    assert mio.blobproto_to_array(mio.read_blobproto("mean.binaryproto")).shape == (1, 3, 4, 4)


# ------------------------------------------------------------------ command line
@pytest.mark.parametrize("argv,expected", [
    (["test", "-model", "nomodel.prototxt", "-weights", "w.caffemodel"],
     "-model: File not found: nomodel.prototxt"),
    (["test", "-model", "n.prototxt", "-weights", "nope.caffemodel"],
     "-weights: File not found: nope.caffemodel"),
    (["time", "-model", "nomodel.prototxt", "-iterations", "1"],
     "-model: File not found: nomodel.prototxt"),
], ids=["test -model", "test -weights", "time -model"])
def test_a_flag_naming_a_missing_file(workdir, capsys, argv, expected):
    (workdir / "n.prototxt").write_text(INPUT)
    caffe.Net("n.prototxt", caffe.TEST).save("w.caffemodel")
    capsys.readouterr()
    assert main(argv) == 1
    assert expected in one_line(capsys)


@pytest.mark.parametrize("command", ["test", "time"])
@pytest.mark.parametrize("iterations", ["0", "-1"])
def test_iterations_below_one(workdir, capsys, command, iterations):
    """Caffe divides by -iterations (test: 'Loss: nan'; time: nan ms); minicaffe printed
    0 as if it had measured something.  A usage error naming the flag."""
    (workdir / "n.prototxt").write_text(INPUT)
    assert main([command, "-model", "n.prototxt", "-iterations", iterations]) == 2
    line = one_line(capsys)
    assert f"-iterations {iterations}" in line and "at least 1" in line


def test_gpu_all_on_a_cpu_machine(workdir, capsys):
    """(right before this audit) -gpu all where no GPU answers: exit 1, naming the flag."""
    from minicaffe.backend import gpu_available
    if gpu_available():
        pytest.skip("a GPU answers here")
    (workdir / "n.prototxt").write_text(INPUT)
    assert main(["test", "-model", "n.prototxt", "-gpu", "all", "-iterations", "1"]) == 1
    assert "-gpu all" in one_line(capsys)
