"""type: "Python" layers, after BVLC Caffe's python/caffe/test/test_python_layer.py and
test_python_layer_with_param_str.py: a chain of x10 layers forward, backward and reshaped,
param_str, phase, learnable blobs (add_blob) through the solver, a .caffemodel and weight
sharing, the errors, a float64 gradient check, and the memory planner's plans.

The layers live in tests/pylayers_example.py, imported by module name from sys.path."""
import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.backend import to_numpy
from minicaffe.layer import BackwardReads
from minicaffe.net import Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing import check_gradient, make_blob, make_layer, sgd_solver, train_steps

TESTS = os.path.dirname(os.path.abspath(__file__))
MODULE = "pylayers_example"


@pytest.fixture(autouse=True)
def _examples_on_sys_path(monkeypatch):
    """Caffe imports python_param.module from sys.path; put tests/ there (pytest's default
    import mode does too, --import-mode=importlib does not)."""
    monkeypatch.syspath_prepend(TESTS)


def net_param(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<test net>")


def py(name, cls, bottom=(), top=(), param_str=None, extra=""):
    """A Python layer's prototxt, its class in tests/pylayers_example.py."""
    blobs = "".join(f' bottom: "{b}"' for b in bottom) + "".join(f' top: "{t}"' for t in top)
    ps = f" param_str: '{param_str}'" if param_str is not None else ""
    return (f'layer {{ type: "Python" name: "{name}"{blobs} '
            f'python_param {{ module: "{MODULE}" layer: "{cls}"{ps} }} {extra} }}\n')


INPUT = 'input: "data" input_shape { dim: 10 dim: 9 dim: 8 }\n'


def python_net():
    return Net(net_param("name: 'pythonnet' force_backward: true\n" + INPUT
                         + py("one", "SimpleLayer", ["data"], ["one"])
                         + py("two", "SimpleLayer", ["one"], ["two"])
                         + py("three", "SimpleLayer", ["two"], ["three"])), caffe.TRAIN)


# ------------------------------------------------------- pycaffe's own tests
def test_forward():
    net = python_net()
    net.blobs["data"].data[...] = 8
    net.forward()
    np.testing.assert_array_equal(net.blobs["three"].data, 10 ** 3 * 8)


def test_backward():
    net = python_net()
    net.blobs["three"].diff[...] = 7                     # no forward first, as pycaffe's test
    net.backward()
    np.testing.assert_array_equal(net.blobs["data"].diff, 10 ** 3 * 7)


def test_reshape():
    net = python_net()
    net.blobs["data"].reshape(4, 4, 4, 4)
    net.forward()
    for blob in net.blobs.values():
        assert blob.data.shape == (4, 4, 4, 4)


def test_the_registered_layer_wraps_the_users_instance():
    net = python_net()
    layer = net.layers[net.layer_names.index("two")]
    assert layer.type == "Python" and "Python" in caffe.known_layer_types()
    assert type(layer.user_layer).__name__ == "SimpleLayer"
    assert isinstance(layer.user_layer, caffe.Layer)
    assert layer.user_layer.name == "two" and layer.user_layer.type == "Python"
    assert layer.blobs is layer.user_layer.blobs and len(layer.blobs) == 0
    assert net.layer_need_backward[net.layer_names.index("one")]


def test_param_str():
    net = Net(net_param("name: 'pythonnet' force_backward: true\n" + INPUT
                        + py("mul10", "SimpleParamLayer", ["data"], ["mul10"], "10")
                        + py("mul2", "SimpleParamLayer", ["mul10"], ["mul2"], "2")),
              caffe.TRAIN)
    assert net.layer_dict["mul10"].user_layer.param_str == "10"
    net.blobs["data"].data[...] = 8
    net.forward()
    np.testing.assert_array_equal(net.blobs["mul2"].data, 2 * 10 * 8)
    net.blobs["mul2"].diff[...] = 7
    net.backward()
    np.testing.assert_array_equal(net.blobs["data"].diff, 2 * 10 * 7)


@pytest.mark.parametrize("phase", [caffe.TRAIN, caffe.TEST])
def test_phase(phase):
    net = Net(net_param("name: 'phase'\n" + py("layer", "PhaseLayer", [], ["phase"])), phase)
    assert net.layer_dict["layer"].user_layer.phase == phase
    assert net.forward()["phase"] == phase


def test_data_layer_reshapes_before_every_forward_and_keeps_its_state():
    net = Net(net_param("name: 'pythondatanet'\n"
                        + py("pythondata", "SimpleDataLayer", [], ["pythondata"])), caffe.TRAIN)
    assert net.blobs["pythondata"].shape == (10,)
    for it in range(120):
        net.forward()
        start = it * 10 % 1000
        np.testing.assert_array_equal(net.blobs["pythondata"].data,
                                      np.arange(start, start + 10) % 1000)


def test_blobs_in_the_definition_are_the_layers_before_its_setup():
    """Caffe's Layer constructor, which PythonLayer inherits, fills blobs_ from
    LayerParameter.blobs before setup() runs: a Python layer written with blobs { } has
    them."""
    text = "name: 'pythonnet'\n" + INPUT + py("layer", "SimpleLayer", ["data"], ["top"],
                                               extra="blobs { shape { dim: 2 } data: [3, 4] }")
    net = Net(net_param(text), caffe.TEST)
    assert [b.data.tolist() for b in net.params["layer"]] == [[3, 4]]
    net.forward()


def test_parameter_layer_saves_loads_and_shares(tmp_path):
    """pycaffe's test_parameter: a learnable blob made by add_blob, its diff, a .caffemodel,
    and share_with."""
    text = "name: 'pythonnet' force_backward: true\n" + INPUT \
        + py("layer", "ParameterLayer", ["data"], ["top"])
    net = Net(net_param(text), caffe.TRAIN)
    net.forward()
    net.backward()
    layer = net.layers[net.layer_names.index("layer")]
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (1,)
    assert layer.blobs[0].name == "layer/param0" and layer.blobs[0].dtype == np.float32
    assert net.params["layer"] is layer.blobs and net.learnable_params == [layer.blobs[0]]
    assert layer.blobs[0].data[0] == 0 and layer.blobs[0].diff[0] == 1
    layer.blobs[0].data[0] += layer.blobs[0].diff[0]
    assert layer.blobs[0].data[0] == 1

    path = str(tmp_path / "python.caffemodel")
    net.save(path)
    layer.blobs[0].data[0] = -1
    net.copy_from(path)
    assert layer.blobs[0].data[0] == 1
    fresh = Net(net_param(text), caffe.TEST, weights=path)
    assert fresh.params["layer"][0].data[0] == 1

    net2 = Net(net_param(text), caffe.TRAIN)
    net2.share_trained_layers_with(net)
    assert net2.params["layer"][0].data[0] == 1


def test_add_blob_takes_integers():
    layer = make_layer(f'name: "p" type: "Python" python_param {{ module: "{MODULE}" '
                       'layer: "SimpleLayer" }')
    blob = layer.blobs.add_blob(2, 3)
    assert blob.shape == (2, 3) and layer.blobs[-1] is blob and blob.dtype == np.float64
    np.testing.assert_array_equal(blob.data, 0)
    assert layer.blobs.add_blob().shape == ()          # pycaffe: a 0-axis blob, count 1
    with pytest.raises(TypeError, match="'p': add_blob takes the dimensions as integers"):
        layer.blobs.add_blob((2, 3))


# ------------------------------------------------------------------- errors
def layer_text(module=MODULE, cls="SimpleLayer"):
    return f'name: "pl" type: "Python" python_param {{ module: "{module}" layer: "{cls}" }}'


def test_missing_module_names_the_layer_and_the_module():
    with pytest.raises(ImportError, match=r"layer 'pl' of type Python: cannot import "
                                          r"python_param.module 'no_such_pylayers' \(No module"):
        make_layer(layer_text(module="no_such_pylayers"))


def test_missing_class_names_the_layer_the_module_and_the_class():
    with pytest.raises(ImportError, match=f"layer 'pl' of type Python: module '{MODULE}' "
                                          r"\(.*pylayers_example.py\) has no class 'Nope'"):
        make_layer(layer_text(cls="Nope"))


def test_class_must_derive_from_caffe_layer():
    with pytest.raises(TypeError, match=f"'pl' of type Python: {MODULE}.NotALayer must be a "
                                        "class derived from caffe.Layer"):
        make_layer(layer_text(cls="NotALayer"))


def test_python_param_must_name_module_and_class():
    with pytest.raises(ValueError, match="'pl' of type Python: python_param .* must name"):
        make_layer('name: "pl" type: "Python"')
    with pytest.raises(ValueError, match="got module 'm', layer ''"):
        make_layer('name: "pl" type: "Python" python_param { module: "m" }')


def test_exception_in_setup_propagates_with_the_layer_named():
    """pycaffe's test_exception: the Net constructor raises the layer's RuntimeError."""
    text = "name: 'pythonnet' force_backward: true\n" + INPUT \
        + py("layer", "ExceptionLayer", ["data"], ["top"])
    with pytest.raises(RuntimeError, match="refuses to set up") as info:
        Net(net_param(text), caffe.TEST)
    assert info.value.__notes__ == [
        f"raised in setup() of Python layer 'layer' ({MODULE}.ExceptionLayer)"]


def test_value_error_in_setup_is_the_nets_error_for_the_layer():
    text = INPUT + py("mul", "SimpleParamLayer", ["data"], ["mul"], "ten")
    with pytest.raises(ValueError, match=r"layer 'mul' \(type Python, bottoms: data "
                                         r"\(10, 9, 8\)\): Parameter string must be a legible"):
        Net(net_param(text), caffe.TEST)


def test_exception_in_forward_keeps_its_type_and_gains_the_layer():
    net = Net(net_param(INPUT + py("bad", "ForwardFailsLayer", ["data"], ["out"])), caffe.TEST)
    with pytest.raises(KeyError, match="no such thing") as info:
        net.forward()
    assert info.value.__notes__ == [
        f"raised in forward() of Python layer 'bad' ({MODULE}.ForwardFailsLayer)"]


def test_a_missing_method_is_named():
    net = Net(net_param(INPUT + py("lazy", "NoForwardLayer", ["data"], ["out"])), caffe.TEST)
    assert net.blobs["out"].shape == (10, 9, 8)          # setup may be left out
    with pytest.raises(NotImplementedError, match=f"Python layer 'lazy' "
                                                  rf"\({MODULE}.NoForwardLayer\) defines no "
                                                  r"forward\(\)"):
        net.forward()


# ------------------------------------------------------------ gradients
def test_gradient_of_the_learnable_layer(rng):
    layer = make_layer(f'name: "aff" type: "Python" python_param {{ module: "{MODULE}" '
                       'layer: "AffineLayer" param_str: \'{"scale": 0.5, "bias": 0.1}\' }')
    x = rng.standard_normal((3, 4, 2, 2))
    top = check_gradient(layer, [make_blob(x)])
    assert [b.shape for b in layer.blobs] == [(4,), (4,)]
    assert layer.param_propagate_down == [True, True]
    layer.forward([make_blob(x)], top)      # the checker leaves the last param perturbed
    np.testing.assert_allclose(top[0].data, 0.5 * x + 0.1, rtol=1e-15)


def test_gradient_of_the_loss_layer_and_the_x10_layer(rng):
    loss = make_layer(f'name: "l" type: "Python" python_param {{ module: "{MODULE}" '
                      'layer: "EuclideanLossLayer" } loss_weight: 1')
    check_gradient(loss, [make_blob(rng.standard_normal((4, 3))),
                          make_blob(rng.standard_normal((4, 3)))])
    check_gradient(make_layer(layer_text()), [make_blob(rng.standard_normal((2, 5)))])


def test_declarations():
    net = Net(net_param(INPUT + 'input: "t" input_shape { dim: 10 dim: 72 }\n'
                        + py("loss", "EuclideanLossLayer", ["data", "t"], ["loss"],
                             extra="loss_weight: 1")), caffe.TRAIN)
    layer = net.layers[net.layer_names.index("loss")]
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1), top=(0,))
    assert layer.internals == {} and layer.share_in_parallel is False
    assert layer.loss_weights == [1.0]
    loss = float(to_numpy(net.forward_from_to()))
    assert loss == float(to_numpy(net.blobs["loss"].data)[0])


# ------------------------------------------- training: the solver and the planner
def affine_net(python: bool) -> str:
    """InnerProduct -> affine -> Euclidean loss; the affine and the loss are Python layers
    or Caffe's Scale (bias_term) and EuclideanLoss."""
    head = """
name: "affine"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 6 dim: 5 } shape { dim: 6 dim: 3 dim: 2 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "reshape" type: "Reshape" bottom: "ip" top: "ip3"
  reshape_param { shape { dim: 0 dim: 3 dim: 2 } } }
"""
    if python:
        return head + py("affine", "AffineLayer", ["ip3"], ["out"]) \
            + py("loss", "EuclideanLossLayer", ["out", "target"], ["loss"],
                 extra="loss_weight: 1")
    return head + """
layer { name: "affine" type: "Scale" bottom: "ip3" top: "out" scale_param { bias_term: true } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "target" top: "loss" }
"""


def make_solver(python=True):
    return sgd_solver(net_param(affine_net(python)), seed=5, max_iter=20)


def test_learnable_blobs_train_as_caffes_scale_layer(tmp_path):
    """The same net with Caffe's Scale and EuclideanLoss layers and with their Python
    counterparts: the SGD solver trains both alike; the trained blobs go through a
    .caffemodel."""
    params, history, losses, _ = train_steps(make_solver(True), 15)
    ref_params, ref_history, ref_losses, _ = train_steps(make_solver(False), 15)
    assert len(params) == len(ref_params) == 4               # ip w, b; affine scale, bias
    for a, b in zip(params + history, ref_params + ref_history):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5)
    assert losses[-1] < losses[0]
    assert not np.allclose(params[2], 1.0)                   # the scale learned

    solver = make_solver(True)
    solver.step(3)
    path = str(tmp_path / "affine.caffemodel")
    solver.net.save(path)
    loaded = Net(net_param(affine_net(True)), caffe.TEST, weights=path)
    for name in ("ip", "affine"):
        for a, b in zip(loaded.params[name], solver.net.params[name]):
            np.testing.assert_array_equal(to_numpy(a.data), to_numpy(b.data))


def test_memory_planner_accepts_the_net_and_trains_it_bit_identically():
    """The GMAP: a Python layer's backward reads its bottoms' and tops' data (declared
    conservatively); `none` and `naive` (every feature map offloaded, freed regions poisoned
    with NaN) train exactly as the plain net does."""
    from swap.gmap import build_gmap
    from swap.plan import make_plan
    net = make_solver().net
    g = build_gmap(net)
    names = [b.name for b in g.buffers]
    # (Reshape's top shares the data of its bottom "ip")
    for layer, reads in (("affine", {"data:ip", "data:out"}),
                         ("loss", {"data:out", "data:target", "data:loss"})):
        step = next(s for s in g.steps if s.name == layer and s.phase == "backward")
        assert reads <= {names[b] for b in step.reads}, layer
    assert not any(n.startswith(("saved:affine", "scratch:affine", "saved:loss")) for n in names)
    assert make_plan(g, "naive").offloaded
    base = train_steps(make_solver(), 5)
    for strategy in ("none", "naive"):
        params, history, losses, ex = train_steps(make_solver(), 5, strategy)
        assert ex.iterations == 5
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy
        assert losses == base[2], strategy


# ---------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_layers_get_cupy_arrays(cp, rng):
    """In GPU mode the user's layer reads and writes CuPy arrays (no host copy) and computes
    what the CPU run computes."""
    x = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer = make_layer(f'name: "aff" type: "Python" python_param {{ module: "{MODULE}" '
                           'layer: "AffineLayer" param_str: \'{"scale": 0.5}\' }',
                           xp=xp, dtype=np.float32)
        bottom = [make_blob(x, xp=xp, dtype=np.float32)]
        top = [caffe.Blob(xp=xp, dtype=np.float32)]
        layer.setup(bottom, top)
        layer.forward(bottom, top)
        assert isinstance(top[0].data, xp.ndarray) and layer.user_layer.xp is xp
        top[0].diff[...] = 1
        layer.backward(top, [True], bottom)
        outs.append([to_numpy(a) for a in (top[0].data, bottom[0].diff, layer.blobs[0].diff)])
    for c, g in zip(*outs):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)
