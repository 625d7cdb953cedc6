"""Engine selection (Caffe's ``engine:`` field) on CPU: the resolution rules of
minicaffe.engine, their warnings and errors, the layers' declarations under the
CAFFE engine, and the in-place hazard check.  The CUDNN engine's numbers are
checked on the GPU in tests/layers/test_cudnn_engine.py."""
import types
import warnings

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe import engine
from minicaffe.blob import Blob
from minicaffe.net import TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing.gradient_check import make_blob, make_layer

FAKE_CUPY = types.SimpleNamespace(__name__="cupy")  # resolve() looks at the module's name

LAYERS = {  # type: (prototxt, *_param field)
    "Convolution": ('name: "c" type: "Convolution" convolution_param { num_output: 2 '
                    'kernel_size: 3 %s }', "convolution_param"),
    "Pooling": ('name: "p" type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 '
                '%s }', "pooling_param"),
    "LRN": ('name: "n" type: "LRN" lrn_param { local_size: 3 %s }', "lrn_param"),
    "Softmax": ('name: "s" type: "Softmax" softmax_param { %s }', "softmax_param"),
    "SoftmaxWithLoss": ('name: "l" type: "SoftmaxWithLoss" softmax_param { %s }',
                        "softmax_param"),
}


@pytest.fixture(autouse=True)
def clean_engine_state(monkeypatch):
    monkeypatch.delenv(engine.ENV_ENGINE, raising=False)
    for name in (engine.ENV_DETERMINISTIC, engine.ENV_TF32, engine.ENV_FIND):
        monkeypatch.delenv(name, raising=False)
    engine.set_default_engine(None)
    engine.reset_warnings()
    yield
    engine.set_default_engine(None)
    engine.reset_warnings()


def fake_layer(field="convolution_param", value=0, name="layer", xp=np):
    """Just what resolve() reads: param.<field>.engine, name, type, xp."""
    param = caffe_pb2.LayerParameter(name=name, type="Convolution")
    getattr(param, field).engine = value
    return types.SimpleNamespace(param=param, name=name, type="Convolution", xp=xp)


def gpu_here(monkeypatch, cudnn: bool):
    """Pretend cuDNN does (or does not) load; the layer's xp says GPU mode."""
    monkeypatch.setattr(engine, "cudnn_available", lambda: cudnn)
    monkeypatch.setattr(engine, "_cudnn_missing", lambda: "libcudnn.so.9 not found")


def setup_layer(kind, engine_text=""):
    text, _ = LAYERS[kind]
    layer = make_layer(text % engine_text, dtype=np.float32)
    x = np.random.default_rng(0).standard_normal((2, 4, 4, 4)).astype(np.float32)
    bottom = [make_blob(x, dtype=np.float32, name="x")]
    if kind == "SoftmaxWithLoss":
        bottom.append(make_blob(np.zeros((2, 4, 4)), dtype=np.float32, name="label"))
    top = [Blob(dtype=np.float32, name="y")]
    layer.setup(bottom, top)
    return layer, bottom, top


def collect(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in got if issubclass(w.category, engine.EngineWarning)]


# ------------------------------------------------------------ CPU nets
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_default_on_cpu_is_caffe_without_warning(kind):
    (layer, _, _), warned = collect(lambda: setup_layer(kind))
    assert layer.engine == engine.CAFFE
    assert layer.engine_fallback is None
    assert warned == []


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_explicit_caffe_on_cpu(kind):
    (layer, _, _), warned = collect(lambda: setup_layer(kind, "engine: CAFFE"))
    assert layer.engine == engine.CAFFE and warned == []


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_explicit_cudnn_on_cpu_falls_back_with_one_warning(kind):
    (layer, _, _), warned = collect(lambda: setup_layer(kind, "engine: CUDNN"))
    assert layer.engine == engine.CAFFE
    assert "CPU mode" in layer.engine_fallback
    assert len(warned) == 1
    msg = str(warned[0].message)
    assert repr(layer.name) in msg and "CUDNN" in msg and "CAFFE" in msg
    # the same layer again (a test net beside the train net): no second warning
    (again, _, _), warned = collect(lambda: setup_layer(kind, "engine: CUDNN"))
    assert again.engine == engine.CAFFE and warned == []


def test_warning_is_once_per_layer_name():
    _, w1 = collect(lambda: engine.resolve(fake_layer(value=2, name="a"), "convolution_param"))
    _, w2 = collect(lambda: engine.resolve(fake_layer(value=2, name="b"), "convolution_param"))
    _, w3 = collect(lambda: engine.resolve(fake_layer(value=2, name="a"), "convolution_param"))
    assert len(w1) == 1 and "'a'" in str(w1[0].message)
    assert len(w2) == 1 and "'b'" in str(w2[0].message)
    assert w3 == []


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_cudnn_requested_on_cpu_computes_what_caffe_computes(kind):
    """The fallback is the CAFFE path itself: same numbers, same declarations."""
    results = []
    for text in ("", "engine: CUDNN"):
        (layer, bottom, top), _ = collect(lambda: setup_layer(kind, text))
        layer.forward(bottom, top)
        top[0].diff[...] = np.linspace(-1, 1, top[0].count).reshape(top[0].shape)
        if kind == "SoftmaxWithLoss":
            top[0].diff[...] = 1.0
        layer.backward(top, [True] + [False] * (len(bottom) - 1), bottom)
        results.append((top[0].data.copy(), bottom[0].diff.copy(), layer.backward_reads(),
                        sorted(layer.internals)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert results[0][2:] == results[1][2:]


# ------------------------------------------------------------ the default
def test_automatic_default(monkeypatch):
    gpu_here(monkeypatch, cudnn=True)
    assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
    assert engine.resolve(fake_layer(xp=np), "convolution_param") == engine.CAFFE
    gpu_here(monkeypatch, cudnn=False)
    (got, warned) = collect(lambda: engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param"))
    assert got == engine.CAFFE and warned == []  # automatic: no cuDNN is no surprise


def test_explicit_cudnn_without_cudnn_warns(monkeypatch):
    gpu_here(monkeypatch, cudnn=False)
    layer = fake_layer(value=2, xp=FAKE_CUPY, name="conv9")
    got, warned = collect(lambda: engine.resolve(layer, "convolution_param"))
    assert got == engine.CAFFE
    assert len(warned) == 1 and "'conv9'" in str(warned[0].message)
    assert "cuDNN does not load" in str(warned[0].message)
    assert "cuDNN does not load" in layer.engine_fallback


def test_explicit_fields_on_gpu(monkeypatch):
    gpu_here(monkeypatch, cudnn=True)
    for field in ("convolution_param", "pooling_param", "lrn_param", "softmax_param"):
        assert engine.resolve(fake_layer(field, 1, xp=FAKE_CUPY), field) == engine.CAFFE
        assert engine.resolve(fake_layer(field, 2, xp=FAKE_CUPY), field) == engine.CUDNN


def test_env_overrides_the_default(monkeypatch):
    gpu_here(monkeypatch, cudnn=True)
    monkeypatch.setenv(engine.ENV_ENGINE, "caffe")
    assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CAFFE
    # an explicit field beats the default
    assert engine.resolve(fake_layer(value=2, xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
    monkeypatch.setenv(engine.ENV_ENGINE, "CUDNN")
    assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
    assert engine.resolve(fake_layer(value=1, xp=FAKE_CUPY), "convolution_param") == engine.CAFFE
    for auto in ("", "DEFAULT", "auto"):
        monkeypatch.setenv(engine.ENV_ENGINE, auto)
        assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
        assert engine.requested_default() == (None, "automatic")


def test_set_default_engine_beats_env(monkeypatch):
    gpu_here(monkeypatch, cudnn=True)
    monkeypatch.setenv(engine.ENV_ENGINE, "CUDNN")
    engine.set_default_engine("CAFFE")
    assert engine.get_default_engine() == engine.CAFFE
    assert engine.requested_default() == (engine.CAFFE, "set_default_engine")
    assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CAFFE
    assert engine.resolve(fake_layer(value=2, xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
    engine.set_default_engine(None)
    assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
    engine.set_default_engine("cudnn")
    monkeypatch.setenv(engine.ENV_ENGINE, "CAFFE")
    assert engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param") == engine.CUDNN
    engine.set_default_engine("DEFAULT")
    assert engine.get_default_engine() is None


def test_forced_cudnn_default_on_cpu_warns_once_for_the_whole_net():
    engine.set_default_engine("CUDNN")
    layers, warned = collect(lambda: [engine.resolve(fake_layer(name=f"l{i}"), "convolution_param")
                                      for i in range(5)])
    assert layers == [engine.CAFFE] * 5
    assert len(warned) == 1
    assert "set_default_engine" in str(warned[0].message) and "CPU mode" in str(warned[0].message)


def test_forced_cudnn_default_without_cudnn_warns(monkeypatch):
    gpu_here(monkeypatch, cudnn=False)
    monkeypatch.setenv(engine.ENV_ENGINE, "CUDNN")
    got, warned = collect(lambda: engine.resolve(fake_layer(xp=FAKE_CUPY), "convolution_param"))
    assert got == engine.CAFFE
    assert len(warned) == 1 and "$MINICAFFE_ENGINE" in str(warned[0].message)


def test_unknown_engine_names_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="set_default_engine.*'TENSORRT'.*CAFFE or CUDNN"):
        engine.set_default_engine("TENSORRT")
    assert engine.get_default_engine() is None
    monkeypatch.setenv(engine.ENV_ENGINE, "cudnn8")
    with pytest.raises(ValueError, match=r"\$MINICAFFE_ENGINE.*'cudnn8'.*CAFFE or CUDNN"):
        engine.resolve(fake_layer(), "convolution_param")
    # explicit fields do not consult the default, so they still resolve
    assert engine.resolve(fake_layer(value=1), "convolution_param") == engine.CAFFE


def test_unknown_env_engine_fails_the_net_build_naming_the_layer(monkeypatch):
    monkeypatch.setenv(engine.ENV_ENGINE, "fast")
    text = ('name: "n" layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 '
            'dim: 2 dim: 4 dim: 4 } } } layer { name: "pool" type: "Pooling" bottom: "x" '
            'top: "y" pooling_param { pool: MAX kernel_size: 2 } }')
    with pytest.raises(ValueError, match="layer 'pool'.*MINICAFFE_ENGINE.*'fast'"):
        Net(parse_text(text, caffe_pb2.NetParameter), TRAIN)


# ------------------------------------------------------------ fall_back, options, reports
def test_fall_back_records_the_reason(capsys):
    layer, _, _ = setup_layer("LRN")
    layer.engine = engine.CUDNN
    engine.fall_back(layer, "a reason")
    assert layer.engine == engine.CAFFE and layer.engine_fallback == "a reason"
    assert "layer 'n' (LRN): a reason; using the CAFFE engine" in capsys.readouterr().err


def test_cudnn_options(monkeypatch):
    for name in (engine.ENV_DETERMINISTIC, engine.ENV_TF32, engine.ENV_FIND,
                 "MINICAFFE_CUDNN_WORKSPACE_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("MINICAFFE_CUDNN_CHUNKS", raising=False)
    o = engine.cudnn_options()
    assert (o.deterministic, o.tf32, o.find) == (False, False, True)  # timed search by default
    assert o.workspace_limit == 4 << 30 and o.chunks
    monkeypatch.setenv("MINICAFFE_CUDNN_CHUNKS", "0")
    assert not engine.cudnn_options().chunks
    monkeypatch.setenv(engine.ENV_DETERMINISTIC, "1")
    monkeypatch.setenv(engine.ENV_TF32, "true")
    monkeypatch.setenv(engine.ENV_FIND, "0")
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", "8M")
    o = engine.cudnn_options()
    assert (o.deterministic, o.tf32, o.find, o.workspace_limit) == (True, True, False, 8 << 20)
    monkeypatch.setenv(engine.ENV_DETERMINISTIC, "maybe")
    with pytest.raises(ValueError, match="MINICAFFE_DETERMINISTIC.*'maybe'"):
        engine.cudnn_options()


NET = '''name: "n"
layer { name: "in" type: "Input" top: "x" top: "label"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } shape { dim: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "x" top: "c"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 engine: CUDNN
                            weight_filler { type: "xavier" } } }
layer { name: "norm" type: "LRN" bottom: "c" top: "n" lrn_param { local_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "n" top: "n" }
layer { name: "pool" type: "Pooling" bottom: "n" top: "p" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "p" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
'''


def test_layer_engines_and_in_place_hazards():
    net, warned = collect(lambda: Net(parse_text(NET, caffe_pb2.NetParameter), TRAIN))
    assert len(warned) == 1 and "'conv'" in str(warned[0].message)
    report = engine.layer_engines(net)
    assert [(n, t, e) for n, t, e, _ in report] == [
        ("conv", "Convolution", "CAFFE"), ("norm", "LRN", "CAFFE"), ("pool", "Pooling", "CAFFE"),
        ("loss", "SoftmaxWithLoss", "CAFFE")]
    assert "CPU mode" in report[0][3] and report[1][3] is None
    # LRN's backward reads its top data, which the in-place ReLU overwrites
    hazards = engine.in_place_hazards(net)
    assert len(hazards) == 1
    assert "'relu'" in hazards[0] and "'norm'" in hazards[0] and "'n'" in hazards[0]
    clean = Net(parse_text(NET.replace('top: "n" }\nlayer { name: "pool"',
                                       'top: "r" }\nlayer { name: "pool"')
                           .replace('bottom: "n" top: "p"', 'bottom: "r" top: "p"'),
                           caffe_pb2.NetParameter), TRAIN)
    assert engine.in_place_hazards(clean) == []


def test_workspace_bound_under_a_budget(monkeypatch):
    from minicaffe.cudnn import ops
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", raising=False)
    assert ops.workspace_limit_under_budget(None) == 4 << 30
    assert ops.workspace_limit_under_budget(12 << 30) == 768 << 20      # a sixteenth
    assert ops.workspace_limit_under_budget(256 << 20) == 64 << 20      # at least 64 MiB
    assert ops.workspace_limit_under_budget(1 << 40) == 4 << 30         # at most the default
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", "8M")          # the user's word wins
    assert ops.workspace_limit_under_budget(12 << 30) == 8 << 20


def test_workspace_bound_per_image(monkeypatch):
    from minicaffe.cudnn import ops
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", raising=False)
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", raising=False)
    assert ops.workspace_per_image_under_budget(12 << 30) == 8 << 20     # the default
    assert ops.workspace_per_image_under_budget(None) == 0               # no budget: fixed
    assert ops.workspace_cap_under_budget(12 << 30) == 3 << 30           # a quarter
    assert ops.workspace_cap_under_budget(64 << 30) == 4 << 30           # at most 4 GiB
    assert ops.workspace_cap_under_budget(128 << 20) == 64 << 20         # at least 64 MiB


def test_workspace_cap_from_the_environment(monkeypatch):
    from minicaffe.cudnn import ops
    monkeypatch.setenv(ops.ENV_WORKSPACE_CAP, "1.5G")
    assert ops.workspace_cap_under_budget(12 << 30) == 3 << 29           # the variable wins
    monkeypatch.setenv(ops.ENV_WORKSPACE_CAP, "8G")
    assert ops.workspace_cap_under_budget(12 << 30) == 4 << 30           # still at most 4 GiB
    monkeypatch.setenv(ops.ENV_WORKSPACE_CAP, "1M")
    assert ops.workspace_cap_under_budget(12 << 30) == 64 << 20          # still at least 64 MiB
    monkeypatch.setenv(ops.ENV_WORKSPACE_CAP, "lots")
    with pytest.raises(ValueError, match="MINICAFFE_CUDNN_WORKSPACE_CAP"):
        ops.workspace_cap_under_budget(12 << 30)
    # k images: k x 8 MiB, at least 64 MiB, at most the cap
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 100) == 800 << 20
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 2) == 64 << 20
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 1000) == 3 << 30
    assert ops.workspace_limit_at(768 << 20, 0, 1000) == 768 << 20      # fixed
    # a floor: the fixed bound below the minibatch where k x 8 MiB passes it
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 69, 768 << 20) == 768 << 20
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 96, 768 << 20) == 768 << 20
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 138, 768 << 20) == 1104 << 20
    assert ops.workspace_limit_at(3 << 30, 8 << 20, 2, 16 << 20) == 64 << 20  # 64 MiB at least
    assert ops.workspace_limit_at(768 << 20, 0, 10, 3 << 30) == 768 << 20     # fixed: no floor
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", "2M")
    assert ops.workspace_per_image_under_budget(12 << 30) == 2 << 20
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", "0")       # off
    assert ops.workspace_per_image_under_budget(12 << 30) == 0
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", "lots")
    with pytest.raises(ValueError, match="MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE"):
        ops.workspace_per_image_under_budget(12 << 30)
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", "2M")
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", "8M")          # a fixed limit wins
    assert ops.workspace_per_image_under_budget(12 << 30) == 0


def test_workspace_chunks_give_every_call_its_bytes_per_image():
    from minicaffe.cudnn import ops
    cap, per = 3 << 30, 8 << 20                    # 12 GiB's cap: 384 images of 8 MiB
    assert ops.workspace_chunks(384, cap, per) == ((0, 384),)
    assert ops.workspace_chunks(385, cap, per) == ((0, 193), (193, 385))
    assert ops.workspace_chunks(1533, cap, per) == ((0, 384), (384, 767), (767, 1150),
                                                    (1150, 1533))
    assert ops.workspace_chunks(1153, cap, per) == ((0, 289), (289, 577), (577, 865),
                                                    (865, 1153))
    assert ops.workspace_chunks(5000, 768 << 20, 0) == ((0, 5000),)   # a fixed bound
    assert ops.workspace_chunks(3, 1, 8) == ((0, 1), (1, 2), (2, 3))  # at least one image
    assert ops.workspace_chunks(0, cap, per) == ((0, 0),)
    for num in (385, 1000, 1533, 4097):            # as even as they come, all of them
        chunks = ops.workspace_chunks(num, cap, per)
        sizes = [b - a for a, b in chunks]
        assert chunks[0][0] == 0 and chunks[-1][1] == num and sum(sizes) == num
        assert all(chunks[i][1] == chunks[i + 1][0] for i in range(len(chunks) - 1))
        assert max(sizes) <= 384 and max(sizes) - min(sizes) <= 1
        assert len(chunks) == -(-num // 384)


def test_workspace_chunks_hold_whole_probes_where_the_probe_set_the_bytes():
    """VGG-16's conv1_2 under a 1.5 GiB cap (H200, session 36): WINOGRAD_NONFUSED needs 55.1
    MiB per image, sized for the images rounded up to 16; 27 images' worth fit the cap, so
    chunks of 24-25 needed 32 images' 1764 MiB and fell back to FFT_TILING.  With chunks of
    at most a multiple of the probe's 16 images, each rounded up still fits."""
    from minicaffe.cudnn import ops
    cap, per = 1536 << 20, int(55.1 * (1 << 20))
    plain = ops.workspace_chunks(221, cap, per)
    assert len(plain) == 9 and max(b - a for a, b in plain) == 25
    assert -(-25 // 16) * 16 * per > cap                 # what went wrong
    chunks = ops.workspace_chunks(221, cap, per, 16)
    sizes = [b - a for a, b in chunks]
    assert len(chunks) == 14 and set(sizes) == {15, 16} and sum(sizes) == 221
    assert ops.workspace_chunks(221, cap, per, 1) == plain
    # where a chunk holds fewer images than one probe, the multiple does not apply
    assert ops.workspace_chunks(40, 10 * per, per, 16) == ops.workspace_chunks(40, 10 * per, per)
    rng = np.random.default_rng(5)
    for _ in range(300):
        num, per = int(rng.integers(1, 3000)), int(rng.integers(1, 1 << 24))
        cap = int(rng.integers(1, 1 << 31))
        chunks = ops.workspace_chunks(num, cap, per, 16)
        sizes = [b - a for a, b in chunks]
        assert chunks[0][0] == 0 and chunks[-1][1] == num and sum(sizes) == num
        assert max(sizes) - min(sizes) <= 1
        if len(chunks) > 1 and cap // per >= 16:        # rounded up to whole probes, it fits
            assert all(-(-n // 16) * 16 * per <= cap for n in sizes)


def test_bound_workspaces_sets_each_cudnn_convolution(recording_net, monkeypatch):
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", raising=False)
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", raising=False)
    Net = recording_net
    # inside a budget: 8 MiB per image, at least a sixteenth of it, up to a quarter of it
    assert engine.bound_workspaces(Net, 12 << 30) == (3 << 30, 8 << 20)
    assert [c.limits for c in (Net.layers[0], Net.layers[2])] == [[3 << 30], [3 << 30]]
    assert Net.layers[0].per_image == [8 << 20] and Net.layers[0].floors == [768 << 20]
    # the bound per image off: a sixteenth of the budget, fixed
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE", "0")
    assert engine.bound_workspaces(Net, 12 << 30) == (768 << 20, 0)
    # Caffe's fixed limit, and no budget (the engine's 4 GiB)
    monkeypatch.delenv("MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE")
    assert engine.bound_workspaces(Net, 12 << 30, limit=8 << 20) == (8 << 20, 0)
    assert engine.bound_workspaces(Net, None) == (4 << 30, 0)
    assert Net.layers[2].limits[-1] == 4 << 30 and Net.layers[2].per_image[-1] == 0
    assert set(Net.layers[2].floors[1:]) == {0}                 # no floor for a fixed bound


def test_workspace_model_asks_the_choice_at_each_shape(monkeypatch):
    """A CUDNN convolution's workspace at another minibatch comes from cuDNN's choices
    (minicaffe.cudnn.ops.conv_workspace_estimate), asked once per shape, with the layer's
    options as they were when the model was taken; the limit where cuDNN cannot compute the
    shape.  A CAFFE-engine layer has no workspace model."""
    import dataclasses
    from minicaffe.cudnn import lib as cudnn_lib
    from minicaffe.cudnn import ops
    layer, bottom, top = setup_layer("Convolution", "pad: 1")
    assert layer.workspace_model() is None                    # CPU: the CAFFE engine
    layer.engine = engine.CUDNN
    # each layer's own bytes per image is test_a_layer_s_bytes_per_image_fit_its_fastest_...
    layer._cudnn = dataclasses.replace(engine.cudnn_options(), workspace_limit=1 << 20,
                                       fit_fastest=False)
    calls = []

    def choose(x_shape, w_shape, pad, stride, dilation, groups, dtype, **kw):
        calls.append((x_shape, kw["limit_at"](x_shape[0])))
        if x_shape[0] > 100:
            raise cudnn_lib.CudnnUnsupported("too large")
        return {"fwd": 64 * x_shape[0], "bwd_data": 0, "bwd_filter": 32 * x_shape[0]}
    monkeypatch.setattr(ops, "conv_workspace_estimate", choose)
    monkeypatch.setattr(ops, "algo_cache_info", lambda: {"searches": 0})
    fn = layer.workspace_model()
    layer.set_workspace_limit(8 << 20)                        # later: not this model's
    assert fn(10) == 640 and fn(10) == 640
    assert calls == [((10, 4, 4, 4), 1 << 20)]                # asked once per shape
    assert fn(101) == 1 << 20 and fn(0) == 0
    # a bound per image: each minibatch is asked under its own limit, and past cuDNN's
    # shapes the answer is that limit (1 MiB per image, at least 64 MiB, at most 256 MiB)
    layer.set_workspace_limit(256 << 20, 1 << 20)
    calls.clear()
    per = layer.workspace_model()
    assert per(20) == 1280 and calls == [((20, 4, 4, 4), 64 << 20)]
    assert per(200) == 200 << 20 and calls[-1] == ((200, 4, 4, 4), 200 << 20)
    # past the cap (256 images) the minibatch runs in chunks (4 of 250), each asked under
    # the cap (a chunk's algorithms need not be linear in its images); without chunks, the
    # whole minibatch under the cap
    assert per(1000) == 256 << 20 and calls[-1] == ((250, 4, 4, 4), 256 << 20)
    assert layer._call_limit(1000, 250) == 256 << 20 and layer._call_limit(200, 200) == 200 << 20
    layer._cudnn = dataclasses.replace(layer._cudnn, chunks=False)
    assert layer.workspace_model()(1000) == 256 << 20
    assert calls[-1] == ((1000, 4, 4, 4), 256 << 20)
    layer._cudnn = dataclasses.replace(layer._cudnn, chunks=True)
    assert layer._workspace_limit_at(100) == 100 << 20
    layer.set_workspace_limit(256 << 20, 1 << 20, 128 << 20)  # a floor of 128 MiB
    assert layer._workspace_limit_at(100) == 128 << 20
    assert layer._workspace_limit_at(200) == 200 << 20


def _choice(direction, workspace, time_ms):
    from minicaffe.cudnn import ops
    return ops.AlgoChoice(direction, 0, "A", 0, workspace, time_ms, False, "find")


def test_fastest_bytes_per_image_takes_the_least_workspace_among_the_fast():
    """Per direction, the least workspace among the algorithms within 5 % of the fastest;
    the most over the directions, per image, rounded up; untimed choices do not count."""
    from minicaffe.cudnn import ops
    cands = {"fwd": (_choice("fwd", 1600, 1.0), _choice("fwd", 160, 1.04),
                     _choice("fwd", 0, 2.0)),
             "bwd_data": (_choice("bwd_data", 3200, 1.0), _choice("bwd_data", 0, 1.06)),
             "bwd_filter": (_choice("bwd_filter", 5, -1.0),)}
    assert ops.fastest_bytes_per_image(cands, 16) == 200          # bwd_data's 3200 / 16
    assert ops.fastest_bytes_per_image(cands, 16, tolerance=1.1) == 10   # fwd's 160 / 16
    assert ops.fastest_bytes_per_image(cands, 3) == 1067          # rounded up
    assert ops.fastest_bytes_per_image({"fwd": ()}, 16) == 0
    with pytest.raises(ValueError, match="images must be positive"):
        ops.fastest_bytes_per_image(cands, 0)


def test_a_layer_s_bytes_per_image_fit_its_fastest_algorithms(monkeypatch):
    """Under a bound per image (1 MiB, cap 256 MiB), a CUDNN convolution whose fastest
    algorithms need more per image (timed once on 16 images within the cap) takes their
    bytes per image: its calls' limits grow by them and a large minibatch runs in chunks of
    cap / need images; one whose fastest need less keeps the bound.  Not under a fixed bound,
    nor with fit_fastest, find or chunks off; the bound where cuDNN cannot run the probe."""
    import dataclasses
    from minicaffe.cudnn import lib as cudnn_lib
    from minicaffe.cudnn import ops
    layer, bottom, top = setup_layer("Convolution", "pad: 1")
    layer.engine = engine.CUDNN
    layer._cudnn = engine.cudnn_options()
    assert layer._cudnn.fit_fastest and layer._cudnn.chunks and layer._cudnn.find
    need = {"fwd": 64 << 20, "bwd_data": 0, "bwd_filter": 0}   # 4 MiB per image at 16
    probes = []

    def candidates(x_shape, w_shape, pad, stride, dilation, groups, dtype, **kw):
        probes.append((x_shape, kw["workspace_limit"]))
        if need is None:
            raise cudnn_lib.CudnnUnsupported("no algorithm")
        return {d: (_choice(d, b, 1.0),) for d, b in need.items()}
    monkeypatch.setattr(ops, "conv_candidates", candidates)
    layer.set_workspace_limit(256 << 20, 1 << 20)
    assert layer._bytes_per_image() == 4 << 20
    assert probes == [((16, 4, 4, 4), 256 << 20)]              # the probe: 16 images, the cap
    assert layer._workspace_limit_at(20) == 80 << 20            # 4 MiB per image
    assert layer._chunks_at(64) == ((0, 64),)
    assert layer._chunks_at(65) == ((0, 33), (33, 65))          # 64 images per chunk at most
    assert len(probes) == 1                                     # once per shape and options
    layer.set_workspace_limit(512 << 20, 1 << 20)               # another cap: probed again
    assert layer._chunks_at(200) == ((0, 100), (100, 200)) and len(probes) == 2
    need = {"fwd": 1 << 20, "bwd_data": 0, "bwd_filter": 0}     # 64 KiB per image: the bound
    layer.set_workspace_limit(256 << 20, 1 << 20)
    layer._fit = None
    assert layer._bytes_per_image() == 1 << 20 and layer._chunks_at(256) == ((0, 256),)
    need = None                                                 # the probe cannot run
    layer._fit = None
    assert layer._bytes_per_image() == 1 << 20
    probes.clear()
    for off in ({"fit_fastest": False}, {"find": False}, {"chunks": False}):
        assert layer._bytes_per_image(dataclasses.replace(layer._cudnn, **off)) == 1 << 20
    layer.set_workspace_limit(8 << 20)                          # a fixed bound
    assert layer._bytes_per_image() == 0 and layer._workspace_limit_at(1000) == 8 << 20
    assert probes == []
    # $MINICAFFE_CUDNN_FIT_FASTEST=0 turns it off in the options
    monkeypatch.setenv(ops.ENV_FIT, "0")
    assert engine.cudnn_options().fit_fastest is False
