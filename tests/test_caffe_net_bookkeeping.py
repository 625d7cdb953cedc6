"""Net bookkeeping checked against BVLC Caffe's src/caffe/net.cpp, layer.hpp and
util/insert_splits.cpp: the expected values below are worked out by hand from that source
(Layer::Forward, SetLossWeights, Net::Init's backward pruning, InsertSplits), not from
minicaffe's output."""
import numpy as np
import pytest

from minicaffe.net import TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text


def make(text, phase=TRAIN):
    return Net(parse_text(text, caffe_pb2.NetParameter, filename="<test net>"), phase,
               dtype=np.float64)


# A loss layer's top (loss weight 1 from LossLayer::LayerSetUp, none in the file) read by
# a Power layer whose own top has loss_weight 1.  InsertSplits counts only loss weights
# written in the file, so 'l' has one reader and no Split: Power's backward writes l's diff
# (3 * 1) over the loss weight that SetLossWeights put there.
LOSS_TOP_READ = """force_backward: true
layer { name: 'in' type: 'Input' top: 'a' top: 'b'
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
layer { name: 'l' type: 'EuclideanLoss' bottom: 'a' bottom: 'b' top: 'l' }
layer { name: 'p' type: 'Power' bottom: 'l' top: 'l2' power_param { scale: 3 } loss_weight: 1 }
"""


def test_loss_is_top_data_dot_top_diff_as_layer_forward_computes_it():
    """Layer::Forward adds caffe_cpu_dot(top data, top diff) for each top with a loss
    weight: the diff's current contents, not the weight given at set-up."""
    net = make(LOSS_TOP_READ)
    assert [n for n in net.layer_names] == ["in", "l", "p"]   # no Split for 'l'
    a = np.arange(6.0).reshape(2, 3)
    net.blobs["a"].data[...] = a
    net.blobs["b"].data[...] = 0
    # l = sum(a^2) / (2 * 2) = 55 / 4; l2 = 3 l; loss = l * 1 + l2 * 1
    assert float(net.forward_from_to()) == pytest.approx(13.75 + 41.25)
    net.backward_from_to()
    # Power: l.diff = 3 * l2.diff = 3 (overwrites the weight 1); EuclideanLoss reads its
    # weight from l.diff: a.diff = 3 * (a - b) / 2
    assert float(net.blobs["l"].diff) == 3.0
    np.testing.assert_allclose(net.blobs["a"].diff, 1.5 * a)
    np.testing.assert_allclose(net.blobs["b"].diff, -1.5 * a)
    # the next forward: dot(l, l.diff) = 13.75 * 3, plus l2 * 1
    assert float(net.forward_from_to()) == pytest.approx(13.75 * 3 + 41.25)
    # pycaffe's user may write the diff too (net.blobs['l'].diff[...] = 0.5)
    net.blobs["l"].diff[...] = 0.5
    assert float(net.forward_from_to()) == pytest.approx(13.75 * 0.5 + 41.25)


GROWING = """
layer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 2 dim: 3 } } }
layer { name: 'p' type: 'Power' bottom: 'x' top: 'p' loss_weight: 2 }
"""


def test_loss_weight_lost_when_the_top_grows():
    """Blob::Reshape to a larger count allocates a new, zeroed diff: the loss weight that
    SetLossWeights wrote is gone, so Layer::Forward's dot gives 0 for that top."""
    net = make(GROWING)
    net.blobs["x"].data[...] = 1.0
    assert float(net.forward_from_to()) == pytest.approx(2.0 * 6)
    net.blobs["x"].reshape(4, 3)
    net.blobs["x"].data[...] = 1.0
    assert float(net.forward_from_to()) == 0.0
    assert not np.asarray(net.blobs["p"].diff).any()


# 'l' carries an explicit loss_weight and is read by Power: InsertSplits counts the weight as
# a reader, so a Split follows 'l' with loss weights [2, 0] and Power reads split top 1; the
# loss layer's loss_weight is cleared, and LossLayer::LayerSetUp gives it the default 1 again.
WEIGHTED_TOP_READ = """force_backward: true
layer { name: 'in' type: 'Input' top: 'a' top: 'b'
  input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
layer { name: 'l' type: 'EuclideanLoss' bottom: 'a' bottom: 'b' top: 'l' loss_weight: 2 }
layer { name: 'p' type: 'Power' bottom: 'l' top: 'l2' power_param { scale: 3 } loss_weight: 1 }
"""


def test_loss_weighted_top_read_elsewhere_splits_and_keeps_the_loss_layers_default_weight():
    net = make(WEIGHTED_TOP_READ)
    assert net.layer_names == ["in", "l", "l_l_0_split", "p"]
    assert net.layer_top_names[2] == ["l_l_0_split_0", "l_l_0_split_1"]
    assert net.layer_bottom_names[3] == ["l_l_0_split_1"]
    assert dict(net.blob_loss_weights) == {"a": 0, "b": 0, "l": 1, "l_l_0_split_0": 2,
                                           "l_l_0_split_1": 0, "l2": 1}
    assert net.outputs == ["l2", "l_l_0_split_0"]          # std::set order
    a = np.arange(6.0).reshape(2, 3)
    net.blobs["a"].data[...] = a
    net.blobs["b"].data[...] = 0
    # l = 13.75: 1 * l (the loss layer) + 2 * l (split top 0) + 1 * 3 l (Power)
    assert float(net.forward_from_to()) == pytest.approx(13.75 + 27.5 + 41.25)
    net.backward_from_to()
    # Split: l.diff = split_0.diff (2) + split_1.diff (3 from Power), over the weight 1
    assert float(net.blobs["l"].diff) == 5.0
    np.testing.assert_allclose(net.blobs["a"].diff, 2.5 * a)
    # next forward: the loss layer's dot(l, l.diff) reads 5
    assert float(net.forward_from_to()) == pytest.approx(13.75 * 5 + 27.5 + 41.25)


def test_split_of_a_weighted_top_clears_every_loss_weight_of_its_layer():
    """InsertSplits' clear_loss_weight() drops all the layer's loss weights, so t1's weight
    2 is lost (t1 needs no Split: the weight alone is one reader)."""
    net = make("""force_backward: true
    layer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 2 dim: 4 } } }
    layer { name: 's' type: 'Slice' bottom: 'x' top: 't0' top: 't1' slice_param { axis: 1 }
      loss_weight: 1 loss_weight: 2 }
    layer { name: 'p' type: 'Power' bottom: 't0' top: 'q' }""")
    assert net.layer_names == ["in", "s", "t0_s_0_split", "p"]
    assert dict(net.blob_loss_weights) == {"x": 0, "t0": 0, "t1": 0, "t0_s_0_split_0": 1,
                                           "t0_s_0_split_1": 0, "q": 0}
    x = np.arange(8.0).reshape(2, 4)
    net.blobs["x"].data[...] = x
    assert float(net.forward_from_to()) == pytest.approx(x[:, :2].sum())
    net.backward_from_to()
    np.testing.assert_array_equal(net.blobs["x"].diff, [[1, 1, 0, 0], [1, 1, 0, 0]])


def test_in_place_layer_after_a_split_reader_is_a_second_source():
    """A reads x, then B works on x in place: InsertSplits gives B a split top as bottom,
    so B's top 'x' is no longer in place and AppendTop finds x made twice."""
    with pytest.raises(ValueError, match="multiple sources"):
        make("""
        layer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 2 dim: 3 } } }
        layer { name: 'A' type: 'Power' bottom: 'x' top: 'y' }
        layer { name: 'B' type: 'ReLU' bottom: 'x' top: 'x' }
        layer { name: 'C' type: 'Power' bottom: 'x' top: 'z' }""")


def test_hdf5_weights_go_to_the_last_layer_of_a_name_caffemodel_to_the_first(tmp_path):
    """CopyTrainedLayersFromHDF5 finds the target in layer_names_index_, built by a loop that
    leaves the last layer of each name; CopyTrainedLayersFrom scans for the first."""
    h5py = pytest.importorskip("h5py")
    net = make("""
    layer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 1 dim: 2 } } }
    layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'y' inner_product_param {
      num_output: 2 weight_filler { type: 'constant' value: 0 } } }
    layer { name: 'ip' type: 'InnerProduct' bottom: 'y' top: 'z' inner_product_param {
      num_output: 2 weight_filler { type: 'constant' value: 0 } } }""")
    w, b = np.arange(4.0).reshape(2, 2) + 1, np.array([5.0, 6.0])
    path = tmp_path / "w.caffemodel.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/ip/0", data=w)
        f.create_dataset("data/ip/1", data=b)
    net.copy_from(str(path))
    first, second = net.layers[1].blobs, net.layers[2].blobs
    assert not first[0].data.any() and not first[1].data.any()
    np.testing.assert_array_equal(second[0].data, w)
    np.testing.assert_array_equal(second[1].data, b)


TWO_IP = """
layer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 1 dim: 2 } } }
layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'y' inner_product_param {
  num_output: 2 weight_filler { type: 'constant' value: %s } } }
layer { name: 'ip' type: 'InnerProduct' bottom: 'y' top: 'z' inner_product_param {
  num_output: 2 weight_filler { type: 'constant' value: %s } } }
"""


def test_share_trained_layers_goes_to_the_first_target_layer_of_each_source_name():
    """ShareTrainedLayersWith walks the source's layers; each shares into the first target
    layer of its name (so the last source 'ip' wins there) and the second target 'ip'
    keeps its own weights."""
    src = make(TWO_IP % (1, 2))
    dst = make(TWO_IP % (7, 7))
    dst.share_with(src)
    np.testing.assert_array_equal(dst.layers[1].blobs[0].data, np.full((2, 2), 2.0))
    np.testing.assert_array_equal(dst.layers[2].blobs[0].data, np.full((2, 2), 7.0))
    src.layers[2].blobs[0].data[...] = 3
    assert (dst.layers[1].blobs[0].data == 3).all()


def test_share_trained_layers_checks_the_blob_count_even_for_a_target_without_params():
    """CHECK_EQ(target_blobs.size(), source blobs) runs for every matched layer."""
    src = make(TWO_IP % (1, 2))
    dst = make("""
    layer { name: 'in' type: 'Input' top: 'x' input_param { shape { dim: 1 dim: 2 } } }
    layer { name: 'ip' type: 'ReLU' bottom: 'x' top: 'y' }""")
    with pytest.raises(ValueError, match="number of blobs"):
        dst.share_with(src)


MANY_PARAMS = """
layer { name: 'in' type: 'Input' top: 'x' top: 'y'
  input_param { shape { dim: 2 dim: 2 dim: 5 dim: 5 } shape { dim: 2 dim: 3 } } }
layer { name: 'conv' type: 'Convolution' bottom: 'x' top: 'c' convolution_param {
  num_output: 3 kernel_size: 3 weight_filler { type: 'gaussian' std: 0.5 }
  bias_filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'bn' type: 'BatchNorm' bottom: 'c' top: 'c' }
layer { name: 'sc' type: 'Scale' bottom: 'c' top: 'c' scale_param { bias_term: true
  filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'prelu' type: 'PReLU' bottom: 'c' top: 'c' }
layer { name: 'deconv' type: 'Deconvolution' bottom: 'c' top: 'd' convolution_param {
  num_output: 2 kernel_size: 2 weight_filler { type: 'gaussian' std: 0.5 }
  bias_filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'frozen' type: 'InnerProduct' bottom: 'd' top: 'f'
  param { lr_mult: 0 } param { lr_mult: 0 } inner_product_param { num_output: 4
  weight_filler { type: 'gaussian' std: 0.5 } bias_filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'ip' type: 'InnerProduct' bottom: 'f' top: 'g' inner_product_param {
  num_output: 3 weight_filler { type: 'gaussian' std: 0.5 }
  bias_filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'bias' type: 'Bias' bottom: 'g' top: 'g'
  bias_param { filler { type: 'gaussian' std: 0.5 } } }
layer { name: 'loss' type: 'EuclideanLoss' bottom: 'g' bottom: 'y' top: 'loss' }
"""


def test_backward_twice_accumulates_param_diffs_and_overwrites_bottom_diffs():
    """Net::Backward zeroes nothing (ClearParamDiffs is the solver's): every layer adds its
    param gradients to the diffs (so two backwards give twice the diff) and writes its
    bottoms' diffs afresh.  Params with lr_mult 0 get param_propagate_down false and keep a
    zero diff; BatchNorm's statistics get none (its Backward_cpu writes no param diff)."""
    from minicaffe.rng import set_random_seed
    set_random_seed(3)
    net = make(MANY_PARAMS)
    rng = np.random.default_rng(0)
    net.blobs["x"].data[...] = rng.standard_normal((2, 2, 5, 5))
    net.blobs["y"].data[...] = rng.standard_normal((2, 3))
    net.forward_from_to()
    net.backward_from_to()
    params = {(n, i): np.array(b.diff) for n, bs in net.params.items() for i, b in enumerate(bs)}
    bottoms = {n: np.array(b.diff) for n, b in net.blobs.items() if n not in ("x", "y")}
    net.backward_from_to()
    for (n, i), d in params.items():
        if n in ("frozen", "bn"):
            assert not d.any(), (n, i)
        elif (n, i) != ("conv", 1):      # BatchNorm takes the mean out: ~0 for the bias
            assert np.abs(d).max() > 1e-6, (n, i)
        np.testing.assert_allclose(net.params[n][i].diff, 2 * d, rtol=1e-12, err_msg=f"{n} {i}")
    for n, d in bottoms.items():
        np.testing.assert_allclose(net.blobs[n].diff, d, rtol=1e-12, err_msg=n)


def test_force_backward_turns_on_every_param_propagate_down():
    """With force_backward Net::Init calls set_param_propagate_down(param_id, true) for every
    param: the lr_mult 0 InnerProduct now accumulates its gradients (BatchNorm still writes
    none), and the data gets its diff."""
    from minicaffe.rng import set_random_seed
    set_random_seed(3)
    net = make("force_backward: true\n" + MANY_PARAMS)
    assert all(all(layer.param_propagate_down) for layer in net.layers)
    rng = np.random.default_rng(0)
    net.blobs["x"].data[...] = rng.standard_normal((2, 2, 5, 5))
    net.blobs["y"].data[...] = rng.standard_normal((2, 3))
    net.forward_from_to()
    net.backward_from_to()
    frozen = [np.array(b.diff) for b in net.params["frozen"]]
    assert all(np.abs(d).max() > 1e-6 for d in frozen)
    assert not any(b.diff.any() for b in net.params["bn"])
    assert np.abs(net.blobs["x"].diff).max() > 1e-6
    net.backward_from_to()
    for b, d in zip(net.params["frozen"], frozen):
        np.testing.assert_allclose(b.diff, 2 * d, rtol=1e-12)


def test_in_place_propagate_down_false_prunes_the_layer_that_wrote_the_blob():
    """Net::Init's pruning keys blobs_skip_backp by name: an in-place ReLU with
    propagate_down: false puts 'c' there, and the InnerProduct whose only top is 'c' then
    skips backward altogether (its params get no gradient), while the ReLU itself still
    runs backward for nothing."""
    net = make("""
    layer { name: 'in' type: 'Input' top: 'x' top: 'y'
      input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
    layer { name: 'ip' type: 'InnerProduct' bottom: 'x' top: 'c' inner_product_param {
      num_output: 3 weight_filler { type: 'gaussian' std: 1 } } }
    layer { name: 'relu' type: 'ReLU' bottom: 'c' top: 'c' propagate_down: false }
    layer { name: 'loss' type: 'EuclideanLoss' bottom: 'c' bottom: 'y' top: 'l' }""")
    assert net.layer_need_backward == [False, False, True, True]
    assert net.bottom_need_backward == [[], [False], [False], [True, False]]
    net.blobs["x"].data[...] = 1.0
    net.forward_from_to()
    net.backward_from_to()
    assert not any(b.diff.any() for b in net.params["ip"])


def test_a_loss_layer_without_loss_weight_is_saved_with_loss_weight_1():
    """LossLayer::LayerSetUp adds loss_weight 1 to the layer's own LayerParameter when the
    file gives none; Layer::ToProto copies that LayerParameter into the saved net (split
    layers included)."""
    net = make(WEIGHTED_TOP_READ.replace("loss_weight: 2", ""))
    saved = {lp.name: list(lp.loss_weight) for lp in net.to_proto().layer}
    assert saved == {"in": [], "l": [1.0], "p": [1.0]}
    net = make(WEIGHTED_TOP_READ)
    saved = {lp.name: list(lp.loss_weight) for lp in net.to_proto().layer}
    assert saved == {"in": [], "l": [1.0], "l_l_0_split": [2.0, 0.0], "p": [1.0]}


def test_a_partial_forward_returns_the_loss_of_its_own_layers():
    """ForwardFromTo sums Layer::Forward's loss over start..end only (pycaffe's _forward)."""
    net = make(WEIGHTED_TOP_READ)
    net.blobs["a"].data[...] = np.arange(6.0).reshape(2, 3)
    net.blobs["b"].data[...] = 0
    assert net._forward(0, 3) == pytest.approx(13.75 + 27.5 + 41.25)
    assert net._forward(2, 3) == pytest.approx(27.5 + 41.25)     # split_0 * 2 + l2 * 1
    assert net._forward(1, 1) == pytest.approx(13.75)
    assert net._forward(3, 3) == pytest.approx(41.25)
    out = net.forward(start="l_l_0_split", end="p")
    assert set(out) == {"l2"} and float(out["l2"]) == pytest.approx(41.25)
