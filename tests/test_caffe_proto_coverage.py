"""caffe.proto field coverage (docs/PROTO_COVERAGE.md).

Every field of minicaffe's schema is either read by the code that acts on its message, or
listed here and in docs/PROTO_COVERAGE.md with what happens to it; the listed fields are then
checked to behave as the table says, against BVLC Caffe's sources (upstream master):

* fields Caffe itself ignores leave minicaffe's numbers unchanged too (an engine hint, the N-d
  im2col switch, DataParameter.force_encoded_color);
* SolverParameter.layer_wise_reduce decides, as in Caffe's NCCL, when --comm nccl all-reduces;
* fields set in a prototxt that do not act here as its author may expect make the net warn,
  with the file, the layer's line, the layer and the field (minicaffe/proto/coverage.py):
  data_param.rand_skip (upstream's Data layer never reads it) and recurrent_param.debug_info
  (Caffe logs an unrolled net that minicaffe does not build).
"""
import pathlib
import re
import warnings

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe import io as mio
from minicaffe.blob import Blob
from minicaffe.net import Net, TRAIN
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.proto.coverage import UnreadFieldWarning, unread_fields
from minicaffe.proto.upgrade import upgrade_v0_layer
from minicaffe.rng import set_random_seed
from minicaffe.solver import Solver
from minicaffe.testing import make_layer

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "PROTO_COVERAGE.md"

# Fields that no minicaffe code acts on, because BVLC Caffe does not act on them either (or
# only on a path that gives the same numbers); each with the Caffe source that says so.
NOT_READ = {
    "ConvolutionParameter.force_nd_im2col":
        "base_conv_layer.cpp: picks the N-d im2col for 2-d too; the same numbers",
    "DataParameter.force_encoded_color":
        "data_layer.cpp (master) never reads it; data_transformer.cpp decodes with "
        "transform_param.force_color/force_gray",
    "ReLUParameter.engine": "layer_factory.cpp: cuDNN's ReLU, the same function",
    "SigmoidParameter.engine": "layer_factory.cpp: cuDNN's sigmoid, the same function",
    "TanHParameter.engine": "layer_factory.cpp: cuDNN's tanh, the same function",
    "LayerParameter.sigmoid_param": "holds only the engine",
    "LayerParameter.tanh_param": "holds only the engine",
    "V0LayerParameter.new_num": "upgrade_proto.cpp's UpgradeV0LayerParameter drops it",
    "V0LayerParameter.new_channels": "upgrade_proto.cpp's UpgradeV0LayerParameter drops it",
}
# Fields read under a composed name (conv.py's _spatial_values: f"{name}_h"), which the
# source scan below cannot see; test_conv_reads_the_h_and_w_fields checks them.
READ_BY_COMPOSED_NAME = {f"ConvolutionParameter.{k}_{hw}"
                         for k in ("kernel", "pad", "stride") for hw in "hw"}
# Fields that are read but warned about when set (minicaffe/proto/coverage.py).
WARNED = {"DataParameter.rand_skip", "RecurrentParameter.debug_info"}

# Modules that convert, draw or print messages rather than act on them: a field named only
# there is not read (upgrade.py is the reader of the legacy V0/V1 messages).
NOT_CONSUMERS = {"proto/caffe_pb2.py", "proto/text.py", "proto/coverage.py", "draw.py",
                 "netspec.py", "coord_map.py", "tools/upgrade_net_proto_text.py"}
LEGACY = ("V0LayerParameter", "V1LayerParameter")


def _sources():
    """minicaffe's modules by their path in the package (cudnn/ binds cuDNN and reads no
    message), and the data-parallel workers' (ps/, which read SolverParameter too)."""
    pkg = ROOT / "minicaffe"
    out = {str(p.relative_to(pkg)): p.read_text() for p in pkg.rglob("*.py")
           if "cudnn" not in p.relative_to(pkg).parts}
    out.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "ps").rglob("*.py")})
    return out


def _mentions(field, text):
    return re.search(r"(\.%s\b|[\"']%s[\"'])" % (field, field), text) is not None


def unread_schema_fields():
    """Every ``Message.field`` of the schema that no consumer of its message names (see
    NOT_CONSUMERS): for a layer's parameter message, the modules that name the
    LayerParameter field holding it; for the legacy layer messages, proto/upgrade.py; for
    the others (NetParameter, SolverParameter, FillerParameter, ...), every module."""
    src = _sources()
    consumers = {k: v for k, v in src.items() if k not in NOT_CONSUMERS}
    holders = {}
    for f in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if f.message_type is not None and f.name.endswith("_param"):
            holders.setdefault(f.message_type.name, []).append(f.name)
    out = []
    for name, msg in caffe_pb2.DESCRIPTOR.message_types_by_name.items():
        if name in LEGACY:
            files = [src["proto/upgrade.py"]]
        elif name in holders:
            files = [t for t in consumers.values()
                     if any(re.search(r"\b%s\b" % h, t) for h in holders[name])]
        else:
            files = list(consumers.values())
        out += [f"{name}.{f.name}" for f in msg.fields
                if not any(_mentions(f.name, t) for t in files)]
    return out


def test_every_field_is_read_or_listed():
    """A field added to caffe.proto (or a reader removed) must be read or listed."""
    fields = {f"{m}.{f.name}" for m, d in caffe_pb2.DESCRIPTOR.message_types_by_name.items()
              for f in d.fields}
    assert set(NOT_READ) | READ_BY_COMPOSED_NAME | WARNED <= fields
    assert len(fields) > 400          # the whole schema (424 fields), legacy messages included
    missing = sorted(set(unread_schema_fields()) - set(NOT_READ) - READ_BY_COMPOSED_NAME)
    assert missing == [], f"fields neither read nor listed in NOT_READ: {missing}"


def test_the_doc_lists_every_unread_and_warned_field_and_only_real_fields():
    text = DOC.read_text()
    for field in sorted(set(NOT_READ) | WARNED):
        assert f"`{field}`" in text, f"{field} is missing from {DOC.name}"
    messages = caffe_pb2.DESCRIPTOR.message_types_by_name
    named = re.findall(r"`([A-Z][A-Za-z0-9]+)\.([a-z_0-9]+)`", text)
    assert len(named) > 40
    for m, f in named:
        assert m in messages and f in messages[m].fields_by_name, f"{DOC.name}: {m}.{f}"


def test_unread_fields_is_empty_for_fields_left_at_their_defaults():
    for text in ('name: "d" type: "Data" data_param { source: "x" batch_size: 1 }',
                 'name: "d" type: "Data" data_param { rand_skip: 0 }',
                 'name: "i" type: "ImageData" image_data_param { rand_skip: 5 }',
                 'name: "l" type: "LSTM" recurrent_param { num_output: 2 }',
                 'name: "l" type: "InnerProduct" recurrent_param { debug_info: true }'):
        assert unread_fields(parse_text(text, caffe_pb2.LayerParameter)) == []


# ------------------------------------------------------------- composed names (conv.py)
def test_conv_reads_the_h_and_w_fields():
    """base_conv_layer.cpp: kernel_h/kernel_w, pad_h/pad_w, stride_h/stride_w; output
    (H + 2 pad - kernel) / stride + 1 per axis (conv_layer.cpp compute_output_shape)."""
    layer = make_layer('name: "c" type: "Convolution" convolution_param { num_output: 2 '
                       "kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0 stride_h: 2 stride_w: 1 }")
    x = Blob((1, 1, 7, 5), dtype=np.float64, name="x")
    top = [Blob(dtype=np.float64, name="y")]
    layer.setup([x], top)
    assert layer.kernel == (3, 1) and layer.pad == (1, 0) and layer.stride == (2, 1)
    assert top[0].shape == (1, 2, (7 + 2 - 3) // 2 + 1, (5 - 1) // 1 + 1)


# ------------------------------------------------------------------ warned fields
def _write(tmp_path, text, name="net.prototxt"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _unread_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, UnreadFieldWarning)]


@pytest.fixture
def lmdb_path(tmp_path):
    """An LMDB of 6 uint8 (1, 2, 2) images, labelled 0..5 in key order."""
    pytest.importorskip("lmdb")
    path = tmp_path / "db"
    with mio.LMDBWriter(path) as w:
        for i in range(6):
            img = np.full((1, 2, 2), 10 * i, dtype=np.uint8)
            w.put(f"{i:08d}", mio.array_to_datum(img, i).SerializeToString())
    return str(path)


DATA_NET = """name: "d"
layer {
  name: "data"
  type: "Data"
  top: "data"
  top: "label"
  data_param { source: "%s" batch_size: 2 backend: LMDB %s }
}
"""


@pytest.mark.parametrize("seed", [1, 2])
def test_data_rand_skip_is_ignored_as_caffe_does_and_the_net_says_so(tmp_path, lmdb_path, seed):
    """data_layer.cpp (master): the cursor starts at the first record, and nothing reads
    rand_skip (upstream dropped it with the 2015 DataReader): batch 1 is records 0 and 1
    whatever the seed.  The net warns once, naming file, line, layer and field."""
    path = _write(tmp_path, DATA_NET % (lmdb_path, "rand_skip: 5"))
    set_random_seed(seed)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        net = Net(path, TRAIN, mode="CPU")
    try:
        msgs = _unread_warnings(rec)
        assert len(msgs) == 1
        assert msgs[0].startswith(f"{path}:2: layer 'data' (type Data): data_param.rand_skip: "
                                  "5 is ignored")
        net.forward()
        np.testing.assert_array_equal(net.blobs["label"].data, [0, 1])
        np.testing.assert_array_equal(net.blobs["data"].data[:, 0, 0, 0], [0, 10])
    finally:
        net.layers[0].close()


def test_data_without_rand_skip_gives_no_warning(tmp_path, lmdb_path):
    path = _write(tmp_path, DATA_NET % (lmdb_path, ""))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        net = Net(path, TRAIN, mode="CPU")
    net.layers[0].close()
    assert _unread_warnings(rec) == []


LSTM_NET = """name: "rec"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 3 dim: 2 dim: 4 } } }
layer { name: "cont" type: "Input" top: "cont" input_param { shape { dim: 3 dim: 2 } } }

layer {
  name: "lstm"
  type: "%s"
  bottom: "x"
  bottom: "cont"
  top: "h"
  recurrent_param { num_output: 5 %s }
}
"""


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_debug_info_is_warned_with_file_line_layer_and_field(tmp_path, kind):
    """recurrent_layer.cpp: unrolled_net_->set_debug_info(debug_info), so Caffe logs every
    blob of the unrolled net; minicaffe builds none and says so."""
    path = _write(tmp_path, LSTM_NET % (kind, "debug_info: true"))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        Net(path, TRAIN, mode="CPU")
    msgs = _unread_warnings(rec)
    assert len(msgs) == 1
    assert msgs[0].startswith(f"{path}:5: layer 'lstm' (type {kind}): "
                              "recurrent_param.debug_info: ")
    path = _write(tmp_path, LSTM_NET % (kind, ""), "quiet.prototxt")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        Net(path, TRAIN, mode="CPU")
    assert _unread_warnings(rec) == []


def test_a_net_given_as_a_message_warns_without_a_file(lmdb_path):
    param = parse_text(DATA_NET % (lmdb_path, "rand_skip: 3"), caffe_pb2.NetParameter)
    with pytest.warns(UnreadFieldWarning, match=r"^layer 'data' \(type Data\): "
                                                r"data_param\.rand_skip: 3 is ignored"):
        net = Net(param, TRAIN, mode="CPU")
    net.layers[0].close()


# ------------------------------------------------------- fields Caffe ignores too
def _forward(text, x, phase=None):
    layer = make_layer(text, phase=phase)
    bottom = [Blob(x.shape, dtype=np.float64, name="x")]
    bottom[0].data[...] = x
    top = [Blob(dtype=np.float64, name="y")]
    set_random_seed(3)       # the same filler draws for both layers
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return top[0].data.copy()


def test_force_nd_im2col_gives_the_same_convolution():
    """base_conv_layer.cpp: force_nd_im2col only picks im2col_nd for a 2-d kernel too."""
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 5))
    conv = ('name: "c" type: "Convolution" convolution_param { num_output: 4 kernel_size: 3 '
            'pad: 1 stride: 2 dilation: 1 weight_filler { type: "gaussian" } '
            'bias_filler { type: "uniform" } %s }')
    np.testing.assert_array_equal(_forward(conv % "force_nd_im2col: true", x),
                                  _forward(conv % "", x))


@pytest.mark.parametrize("kind,param", [("ReLU", "relu_param { negative_slope: 0.1 %s }"),
                                        ("ReLU", "relu_param { %s }"),
                                        ("Sigmoid", "sigmoid_param { %s }"),
                                        ("TanH", "tanh_param { %s }")])
def test_neuron_engines_give_the_same_function(kind, param):
    """layer_factory.cpp: GetReLULayer / GetSigmoidLayer / GetTanHLayer pick cuDNN's kernels
    of the same function (leaky ReLU falls back to Caffe's own); in CPU mode minicaffe's one
    path serves every engine, with no warning."""
    x = np.random.default_rng(1).standard_normal((2, 3, 4))
    text = f'name: "n" type: "{kind}" {param}'
    want = _forward(text % "", x)
    for engine in ("CAFFE", "CUDNN"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(_forward(text % f"engine: {engine}", x), want)


def test_force_encoded_color_leaves_a_gray_encoded_datum_gray(tmp_path):
    """data_layer.cpp (master) never reads data_param.force_encoded_color; the transformer
    decodes an encoded Datum natively (DecodeDatumToCVMatNative: a gray PNG stays one
    channel) unless transform_param.force_color, the field that does act."""
    pytest.importorskip("lmdb")
    Image = pytest.importorskip("PIL.Image")
    import io as pyio
    path = tmp_path / "png_db"
    with mio.LMDBWriter(path) as w:
        for i in range(2):
            buf = pyio.BytesIO()
            Image.fromarray(np.full((3, 4), 40 * (i + 1), dtype=np.uint8), mode="L").save(
                buf, format="PNG")
            d = caffe_pb2.Datum(encoded=True, data=buf.getvalue(), label=i)
            w.put(f"{i:08d}", d.SerializeToString())

    def channels(data_extra, transform):
        layer = make_layer(f'name: "d" type: "Data" top: "data" top: "label" data_param {{ '
                           f'source: "{path}" batch_size: 2 backend: LMDB {data_extra} }} '
                           f"transform_param {{ {transform} }}", dtype=np.float32)
        tops = [Blob(name="data"), Blob(name="label")]
        layer.setup([], tops)
        layer.forward([], tops)
        layer.close()
        return tops[0].shape[1], float(tops[0].data[1, 0, 0, 0])

    assert channels("force_encoded_color: true", "") == (1, 80.0)
    assert channels("", "") == (1, 80.0)
    assert channels("", "force_color: true") == (3, 80.0)


NET = """name: "tiny"
layer { name: "data" type: "DummyData" top: "x" top: "t"
        dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
                           data_filler { type: "gaussian" } data_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
"""


def test_layer_wise_reduce_decides_the_nccl_overlap_where_nothing_else_does():
    """parallel.cpp: with NCCL, layer_wise_reduce (default true) all-reduces each layer's
    gradients as backward finishes them, false all of them after backward: --comm nccl's
    overlap.  --no-overlap (an explicit overlap) and $MINICAFFE_PS_OVERLAP come first."""
    from ps.overlap import ENV_OVERLAP, nccl_overlap_default
    p = caffe_pb2.SolverParameter()
    assert nccl_overlap_default(p, env={}) is True
    p.layer_wise_reduce = False
    assert nccl_overlap_default(p, env={}) is False
    assert nccl_overlap_default(p, env={ENV_OVERLAP: "1"}) is True
    p.layer_wise_reduce = True
    assert nccl_overlap_default(p, env={ENV_OVERLAP: "0"}) is False
    assert nccl_overlap_default(p, env={}) is True


def test_layer_wise_reduce_changes_no_single_process_update():
    """One solver (no NCCL) updates the same whatever layer_wise_reduce says."""
    def train(**kw):
        p = caffe_pb2.SolverParameter(base_lr=0.1, momentum=0.9, max_iter=3, display=0,
                                      random_seed=4, solver_mode=caffe_pb2.SolverParameter.CPU,
                                      snapshot_after_train=False,
                                      **kw)
        p.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
        s = Solver(p, verbose=False)
        s.solve()
        return [b.data.copy() for b in s.net.learnable_params]

    for a, b in zip(train(layer_wise_reduce=False), train(layer_wise_reduce=True)):
        np.testing.assert_array_equal(a, b)


def test_v0_new_num_and_new_channels_are_dropped_as_caffe_drops_them():
    """upgrade_proto.cpp's UpgradeV0LayerParameter has no case for new_num or new_channels
    (new_height and new_width go to image_data_param); the V1 layer has no trace of them."""
    conn = parse_text('layer { name: "im" type: "images" source: "l.txt" batchsize: 2 '
                      "new_num: 3 new_channels: 1 new_height: 5 new_width: 6 } "
                      'top: "data" top: "label"', caffe_pb2.V1LayerParameter)
    problems = []
    v1 = upgrade_v0_layer(conn, problems=problems)
    assert problems == []
    assert v1.type == caffe_pb2.V1LayerParameter.IMAGE_DATA
    p = v1.image_data_param
    assert (p.source, p.batch_size, p.new_height, p.new_width) == ("l.txt", 2, 5, 6)
    assert "new_num" not in str(v1) and "new_channels" not in str(v1)
