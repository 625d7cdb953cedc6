"""swap.gmap: the global memory-object access pattern of a built net."""
import pytest

from minicaffe.layers.conv import ConvolutionLayer
from swap.gmap import (BACKWARD, CAFFE, CONST_DIFF, DATA, DIFF, FORWARD, HISTORY, PARAM,
                       PARAM_DIFF, SAVED, SCRATCH, build_gmap)
from swap.memory import caffe_total
from swap.plan import plan_none


def _unique(storages):
    seen = {}
    for st, nbytes in storages:
        seen[id(st)] = max(seen.get(id(st), 0), nbytes)
    return sum(seen.values())


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_sizes_are_the_sums_of_the_nets_buffers(build_net, which):
    """For `none` (everything resident) the GMAP holds exactly the net's memory: unique blob
    data, the diffs backward writes (plus the loss weight), 3 x params, declared internals."""
    net = build_net(which)
    g = build_gmap(net)
    data = _unique((b.data_storage, b.nbytes) for b in net.blobs.values())
    written = [(b.diff_storage, b.nbytes)
               for li, bl in enumerate(net.bottom_vecs) for bi, b in enumerate(bl)
               if net.layer_need_backward[li] and net.bottom_need_backward[li][bi]]
    diffs = _unique(written)
    # diffs backward reads that nobody writes: the loss weight, and zeros (a Split's top
    # feeding the Accuracy layer) -- Caffe allocates both
    ids = {id(st) for st, _ in written}
    const = _unique((t.diff_storage, t.nbytes)
                    for li, tl in enumerate(net.top_vecs) for t in tl
                    if net.layer_need_backward[li] and id(t.diff_storage) not in ids)
    params = sum(p.nbytes for p in net.learnable_params)
    internals = sum(it.blob.nbytes for layer in net.layers for it in layer.internals.values())
    assert g.total((DATA,)) == data
    assert g.total((DIFF,)) == diffs
    assert g.total((CONST_DIFF,)) == const >= 4            # the loss weight, one float
    assert g.total((PARAM,)) == g.total((PARAM_DIFF,)) == g.total((HISTORY,)) == params
    assert g.total((SAVED, SCRATCH)) == internals
    assert g.total() == data + diffs + const + 3 * params + internals
    # the none plan reserves all of it (and Caffe's extras), aligned
    plan = plan_none(g, caffe=False)
    assert plan.peak == plan.arena_bytes >= g.total()
    assert plan.peak - g.total() < 512 * len(g.buffers)


def test_storage_identity_in_place_and_split(build_net):
    net = build_net("resnet")
    g = build_gmap(net)
    names = {b.name for b in g.buffers}
    # conv1 -> BN -> Scale -> ReLU in place, then a Split: one data buffer for all of them
    assert "data:conv1" in names
    assert not any(n.startswith("data:conv1_relu_conv1_0_split") for n in names)
    # but every Split top has its own diff
    assert {"diff:conv1_relu_conv1_0_split_0", "diff:conv1_relu_conv1_0_split_1",
            "diff:conv1"} <= names
    # data and label get no diff; the loss top's diff is a resident constant
    assert "diff:data" not in names and "diff:label" not in names
    assert g.find("diff:loss").kind == CONST_DIFF and g.find("diff:loss").persistent
    assert g.find("data:loss").persistent                 # a net output


def test_steps_and_liveness(build_net):
    net = build_net("lenet")
    g = build_gmap(net)
    n = len(net.layers)
    bwd = [li for li in range(n - 1, -1, -1) if net.layer_need_backward[li]]
    assert g.n_steps == n + len(bwd)
    assert [s.layer for s in g.steps] == list(range(n)) + bwd
    assert all(s.phase == FORWARD for s in g.steps[:n])
    assert all(s.phase == BACKWARD for s in g.steps[n:])
    assert "data" not in [g.steps[j].name for j in range(n, g.n_steps)]   # no backward
    assert "acc" not in [g.steps[j].name for j in range(n, g.n_steps)]
    step = {(s.name, s.phase): s.index for s in g.steps}
    # conv2's output, ReLU'd in place: forward last use is ip1's forward; backward reads it
    # for relu2 (top data) and ip1 (weight gradient)
    c2 = g.find("data:conv2")
    assert c2.forward_uses[-1] == step[("ip1", FORWARD)]
    assert set(c2.backward_uses) == {step[("ip1", BACKWARD)], step[("relu2", BACKWARD)]}
    assert c2.is_feature_map
    # pool1's output is read by conv2's backward (weight gradient) only
    p1 = g.find("data:pool1")
    assert p1.backward_uses == (step[("conv2", BACKWARD)],)
    # the max-pool mask is saved: forward of pool1 to its backward
    mask = g.find("saved:pool1/mask")
    assert mask.uses == (step[("pool1", FORWARD)], step[("pool1", BACKWARD)])
    # scratch lives within a step: conv im2col in conv1's forward and backward
    col = g.find("scratch:conv1/col")
    assert col.kind == SCRATCH and col.uses == (step[("conv1", FORWARD)],
                                                step[("conv1", BACKWARD)])
    assert col.id in g.steps[step[("conv1", FORWARD)]].scratch
    # the naive pattern: offload after the last forward use, prefetch for the first backward use
    assert c2.id in g.steps[step[("ip1", FORWARD)]].offload
    assert c2.id in g.steps[step[("ip1", BACKWARD)]].prefetch
    # diffs: written first by ip1's backward, last read by conv2's backward
    d = g.find("diff:conv2")
    assert d.uses[0] == step[("ip1", BACKWARD)] and d.uses[-1] == step[("conv2", BACKWARD)]
    assert d.id in g.steps[step[("ip1", BACKWARD)]].allocate
    assert d.id in g.steps[step[("conv2", BACKWARD)]].release


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_sizes_and_flops_are_linear_in_the_batch(build_net, which):
    """Built at batch 4 and scaled to 12, the GMAP equals the one built at batch 12."""
    g4 = build_gmap(build_net(which, batch=4)).at(12)
    g12 = build_gmap(build_net(which, batch=12))
    assert [b.name for b in g4.buffers] == [b.name for b in g12.buffers]
    assert g4.sizes() == g12.sizes()
    # eq. (1): FLOPs scale with k (the few FLOPs of a loss or an accuracy, counted per batch
    # by their layers, are the exception)
    reductions = ("SoftmaxWithLoss", "Accuracy")
    assert [s.flops for s in g4.steps if s.type not in reductions] == \
        pytest.approx([s.flops for s in g12.steps if s.type not in reductions])
    assert [(s.reads, s.writes, s.scratch) for s in g4.steps] == \
        [(s.reads, s.writes, s.scratch) for s in g12.steps]
    p = next(b for b in g4.buffers if b.kind == PARAM)
    assert g4.nbytes(p.id) == build_gmap(build_net(which, batch=4)).nbytes(p.id)


def test_caffe_accounting(build_net, monkeypatch):
    """With one image of im2col per convolution (Caffe's), the none plan's buffers are exactly
    what Caffe allocates; Caffe's extras are the in-place BatchNorm diff copies and the data
    blob's diff under a CAFFE convolution."""
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 0)
    g = build_gmap(build_net("resnet"))
    assert g.total(caffe=False) + g.total((CAFFE,)) == caffe_total(g)
    extras = {b.name for b in g.buffers if b.kind == CAFFE}
    assert "caffe:conv1/bottom0_diff" in extras
    assert {f"caffe:bn_{c}/x_norm_diff" for c in ("conv1", "res2_a", "res3_p")} <= extras
    assert g.find("caffe:bn_conv1/x_norm_diff").nbytes(g.k) == g.find("data:conv1").nbytes(g.k)


def test_caffe_accounting_with_chunked_im2col(build_net):
    """minicaffe lowers several images at once; Caffe's figure still counts one."""
    net = build_net("resnet", batch=8)
    g = build_gmap(net)
    col = g.find("scratch:res2_a/col")
    conv = net.layers[net.layer_index("res2_a")]
    assert col.nbytes(8) == 8 * col.caffe_nbytes(8) == 8 * conv.kdim * conv.out_spatial * 4
    assert g.find("scratch:res2_a/top_diff_t").caffe_nbytes(8) == 0


def test_caffe_accounting_of_cudnn_workspaces(build_net):
    """A cuDNN convolution in Caffe keeps three streams' workspaces, each at most 8 MiB per
    algorithm: where the layer runs cuDNN (its own ``workspace`` internal, one stream's), Caffe
    holds two more of it; where it does not (CPU mode), the bound is reserved."""
    import numpy as np
    net = build_net("resnet")
    conv = net.layers[net.layer_index("res2_a")]
    conv.param.convolution_param.engine = 2            # CUDNN, as the prototxt says
    g = build_gmap(net)
    assert g.find("caffe:res2_a/cudnn_workspace").nbytes(g.k) == 3 * (8 << 20) * conv.group
    # as the layer is on a GPU: no column buffer, a workspace of the chosen algorithms
    for name in list(conv.internals):
        conv.internals.pop(name)
    conv.add_internal("workspace", (3 << 20,), saved=False, batch_scaled=False, dtype=np.uint8)
    g = build_gmap(net)
    ws = g.find("scratch:res2_a/workspace")
    assert ws.nbytes(g.k) == ws.caffe_nbytes(g.k) == 3 << 20
    assert g.find("caffe:res2_a/cudnn_workspace").nbytes(g.k) == 2 * (3 << 20)
    assert g.find("caffe:res2_a/cudnn_workspace").nbytes(4 * g.k) == 2 * (3 << 20)   # no k
    conv.internals["workspace"].blob.reshape((0,))     # zero-workspace algorithms
    g = build_gmap(net)
    assert not any(b.name == "caffe:res2_a/cudnn_workspace" for b in g.buffers)


def test_adam_keeps_two_history_slots(build_net):
    net = build_net("lenet")
    one = build_gmap(net).total((HISTORY,))
    for solver_type, slots in (("Adam", 2), ("AdaDelta", 2), ("AdaGrad", 1), ("RMSProp", 1),
                               ("Nesterov", 1)):
        assert build_gmap(net, solver_type=solver_type).total((HISTORY,)) == slots * one
    with pytest.raises(ValueError, match="unknown solver type"):
        build_gmap(net, solver_type="Adamm")


def test_chunked_im2col_scales_up_to_its_bound(build_net, monkeypatch):
    """minicaffe's convolution lowers min(k, cap) images at a time: its scratch grows with k
    only up to the bound, from whatever batch the net was built at."""
    conv = build_net("resnet", batch=2).layers[1]
    per_image = conv.kdim * conv.out_spatial * 4
    monkeypatch.setattr(ConvolutionLayer, "col_buffer_bytes", 3 * per_image)  # cap: 3 images
    for built in (2, 8):
        g = build_gmap(build_net("resnet", batch=built))
        for k in (2, 5, 8):       # (at k = 1 the layer drops its unused top_diff_t scratch)
            assert g.at(k).sizes() == build_gmap(build_net("resnet", batch=k)).sizes(), (built, k)
    col = build_gmap(build_net("resnet", batch=8)).find("scratch:conv1/col")
    assert col.nbytes(1) == per_image and col.nbytes(3) == col.nbytes(50) == 3 * per_image


def _fake_cudnn_conv(net, name, ws_of_num, own=3 << 20):
    """Make the convolution ``name`` look as it does on a GPU under the CUDNN engine: a
    ``workspace`` internal of ``own`` bytes and a workspace model ``ws_of_num`` (images ->
    bytes), as cuDNN's choice at each shape would give."""
    import numpy as np
    conv = net.layers[net.layer_index(name)]
    conv.param.convolution_param.engine = 2
    for iname in list(conv.internals):
        conv.internals.pop(iname)
    conv.add_internal("workspace", (own,), saved=False, batch_scaled=False, dtype=np.uint8)
    conv.workspace_model = lambda: ws_of_num
    return conv


def test_a_cudnn_workspace_is_taken_at_each_k(build_net):
    """cuDNN chooses other algorithms, with other workspaces, at other minibatches: the GMAP
    asks the layer's workspace model at k (its images scaled from the net's k), for the
    layer's own scratch and for Caffe's two more streams; at the net's own k it is the
    workspace the layer has."""
    net = build_net("resnet", batch=4)
    asked = []

    def ws(num):
        asked.append(num)
        return 0 if num < 8 else (1 << 20) * num      # zero-workspace algorithms below 8

    _fake_cudnn_conv(net, "res2_a", ws)
    g = build_gmap(net)
    b = g.find("scratch:res2_a/workspace")
    assert b.nbytes(4) == 3 << 20 and not asked         # the layer's own at k0
    assert b.nbytes(16) == 16 << 20 and asked == [16]
    assert b.nbytes(2) == 0 and b.caffe_nbytes(32) == 32 << 20
    assert g.find("caffe:res2_a/cudnn_workspace").nbytes(16) == 2 * (16 << 20)
    for k in (2, 16, 64):
        assert g.at(k).nbytes(b.id) == ws(k)
    assert b.size == type(b.size)(3 << 20, False)        # per_k is not part of the value
    # the plans see it: Caffe's none plan at 64 holds the 64 MiB workspace and two more
    from swap.plan import plan_none
    base = plan_none(g.at(64)).peak
    _fake_cudnn_conv(net, "res2_a", lambda num: 0)
    assert base - plan_none(build_gmap(net).at(64)).peak >= 64 << 20


def test_a_zero_workspace_at_the_nets_k_is_still_asked_at_others(build_net):
    """A convolution whose algorithms need no workspace at the net's k keeps its (empty)
    workspace buffer in the GMAP, so that a k where cuDNN wants one counts it."""
    net = build_net("resnet", batch=4)
    _fake_cudnn_conv(net, "res2_a", lambda num: (5 << 20) if num > 4 else 0, own=0)
    g = build_gmap(net)
    b = g.find("scratch:res2_a/workspace")
    assert b.nbytes(4) == 0 and b.nbytes(8) == 5 << 20
    assert g.find("caffe:res2_a/cudnn_workspace").nbytes(8) == 10 << 20


def test_tuner_sizes_ask_the_workspace_at_k(build_net):
    """The tuner's vectorized sizes agree with the GMAP's, per-k workspaces included."""
    from swap.arena import align
    from swap.tuner import Search, device_models
    net = build_net("resnet", batch=4)
    _fake_cudnn_conv(net, "res2_a", lambda num: (1 << 20) * num + 7)
    g = build_gmap(net)
    model, pcie = device_models()
    s = Search(g, 1 << 40, model, pcie)
    for k in (1, 4, 9, 33):
        assert list(s._sizes(k)) == [align(b.nbytes(k)) for b in g.buffers]


@pytest.mark.parametrize("shape", ["steep", "flat"])
def test_caffe_max_batch_takes_the_exact_total_not_a_line(build_net, shape):
    """A line through k = 1 and 2 misses where a workspace grows there and stops at its limit
    (too steep: the answer too small) or shrinks there by about an image's bytes (too flat: a
    walk down from near k_limit, AlexNet's timeout under CUDNN); the exact total decides."""
    from swap.memory import caffe_max_batch
    net = build_net("resnet", batch=4)
    _fake_cudnn_conv(net, "res2_a", lambda num: 0)
    g = build_gmap(net)
    per_image = caffe_total(g.at(2)) - caffe_total(g.at(1))     # own + Caffe's 2 streams: 3x
    if shape == "steep":
        ws = lambda num: min(num, 2) * (64 << 20)                  # noqa: E731
    else:
        ws = lambda num: (64 << 20) - (0 if num == 1 else per_image // 3 - 1024)  # noqa: E731
    _fake_cudnn_conv(net, "res2_a", ws)
    g = build_gmap(net)
    budget = caffe_total(g.at(12))
    k = caffe_max_batch(g, budget)
    assert caffe_total(g.at(k)) <= budget < caffe_total(g.at(k + 1))
    assert k >= 12


def test_a_saved_gmap_reads_back_equal_with_its_workspaces_sampled(build_net):
    """gmap_to_dict / gmap_from_dict (what a profile keeps for `minicaffe plan --layout
    device`): the same buffers and steps through JSON; a per-k workspace keeps its bytes at
    the sampled ks exactly and is interpolated between them (SampledSize)."""
    import json
    from swap.gmap import SampledSize, gmap_from_dict, gmap_to_dict, sample_ks
    net = build_net("resnet", batch=4)

    def ws(num):
        return 0 if num < 8 else (1 << 20) * num + 4096 * (num % 3)
    _fake_cudnn_conv(net, "res2_a", ws)
    g = build_gmap(net, solver_type="Adam")
    ks = sample_ks(64, extra=(5,))
    assert ks[0] == 1 and ks[-1] == 64 and 5 in ks and len(ks) <= 49
    d = json.loads(json.dumps(gmap_to_dict(g, ks, solver_type="Adam")))
    assert d["solver_type"] == "Adam"
    r = gmap_from_dict(d)
    assert r == g and r.layer_names == g.layer_names
    b = r.find("scratch:res2_a/workspace")
    assert isinstance(b.size.per_k, SampledSize)
    for k in ks:
        assert r.at(k).sizes() == g.at(k).sizes()
    between = [k for k in range(9, 64) if k not in ks]
    assert between and all(abs(b.nbytes(k) - ws(k)) <= 4096 * 2 for k in between)
    fixed = [i for i, x in enumerate(g.buffers) if x.size.per_k is None]
    for k in between:       # each GMAP at k once (at(k) builds one)
        rk, gk = r.at(k), g.at(k)
        assert all(rk.nbytes(i) == gk.nbytes(i) for i in fixed), k
    assert SampledSize([[4, 400], [8, 1600]])(16) == 3200          # past the samples: per image
    assert SampledSize([[4, 400], [8, 1600]])(2) == 200
    assert SampledSize([[4, 400], [8, 1600]])(6) == 1000
    with pytest.raises(ValueError, match="not a saved GMAP"):
        gmap_from_dict({**d, "version": 99})
