"""Seeded fuzz of pycaffe's Net call semantics: forward, backward, forward_all and
forward_backward_all with random ``start``/``end`` names (after one another, in-place
layers, unknown names, names two layers share), ``blobs=[...]``/``diffs=[...]``, keyword
arrays of right and wrong shapes, and batch counts that do not divide the batch.

Each call runs on minicaffe's Net and on a reference: a second copy of the same net
driven by pycaffe.py's own functions (BVLC master ``_Net_forward``, ``_Net_backward``,
``_Net_forward_all``, ``_Net_forward_backward_all``, ``_Net_batch``, ``top_names``,
``bottom_names``, ``inputs``, ``outputs``), transcribed below onto the raw ``_caffe`` members
(``_layer_names``, ``_blob_names``, ``_blobs``, ``_inputs``, ``_outputs``, ``_top_ids``,
``_bottom_ids``, ``_forward``, ``_backward``).  Compared after every call: whether it
raised, the returned keys and arrays (views of the blobs from forward/backward, copies from
the batched calls), every blob's data and diff and every param diff, and which layers ran
(callbacks, against net.cpp's ForwardFromTo: start..end inclusive, and BackwardFromTo:
start down to end, callbacks also for layers that need no backward).

Where the reference follows minicaffe rather than pycaffe, README's "Known differences from
pycaffe" says so; each place is marked ``# minicaffe (README):``.
"""
from collections import OrderedDict
from itertools import zip_longest

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2
from google.protobuf import text_format

GAUSS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.2 }'

# two inputs, a split blob (h: ip2 and ip3), in-place ReLUs, an in-place output (s)
TWO_IN = f"""name: "two_in" force_backward: true
layer {{ name: "in" type: "Input" top: "data" top: "aux"
        input_param {{ shape {{ dim: 4 dim: 3 }} shape {{ dim: 4 dim: 2 }} }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
        inner_product_param {{ num_output: 5 {GAUSS} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "h" top: "h" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "h" top: "a"
        inner_product_param {{ num_output: 3 {GAUSS} }} }}
layer {{ name: "ip3" type: "InnerProduct" bottom: "h" top: "b"
        inner_product_param {{ num_output: 2 {GAUSS} }} }}
layer {{ name: "sum" type: "Eltwise" bottom: "b" bottom: "aux" top: "s" }}
layer {{ name: "relu2" type: "ReLU" bottom: "s" top: "s" }}
"""

# a loss (a 0-axis top) next to a Softmax output; score is split
LOSS = f"""name: "loss" force_backward: true
layer {{ name: "data" type: "Input" top: "data" top: "label"
        input_param {{ shape {{ dim: 3 dim: 1 dim: 4 dim: 4 }} shape {{ dim: 3 }} }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param {{ num_output: 2 kernel_size: 3 {GAUSS} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "conv" top: "conv" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "conv" top: "score"
        inner_product_param {{ num_output: 3 {GAUSS} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }}
layer {{ name: "prob" type: "Softmax" bottom: "score" top: "prob" }}
"""

# two layers named "act" (Caffe's Net::Init does not refuse it): list.index finds the first,
# top_names/bottom_names (keyed by name) hold the last
DUP = f"""name: "dup" force_backward: true
layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 2 dim: 3 }} }} }}
layer {{ name: "act" type: "ReLU" bottom: "x" top: "y" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "y" top: "z"
        inner_product_param {{ num_output: 4 {GAUSS} }} }}
layer {{ name: "act" type: "TanH" bottom: "z" top: "t" }}
"""

NETS = {"two_in": TWO_IN, "loss": LOSS, "dup": DUP}


def build(text):
    param = caffe_pb2.NetParameter()
    text_format.Merge(text, param)
    return caffe.Net(param, caffe.TEST)


def pair(text):
    """Two nets with the same weights: the one under test and the reference's."""
    net, ref = build(text), build(text)
    for name, blobs in net.params.items():
        for b, r in zip(blobs, ref.params[name]):
            r.data[...] = b.data
    return net, ref


class Ref:
    """pycaffe.py (BVLC master), written onto the raw members of ``raw``."""

    def __init__(self, raw):
        self.raw = raw
        self.ran = []           # ("f"|"b", layer index), as net.cpp's loops visit them

    # ------------------------------------------------ the properties pycaffe builds
    @property
    def blobs(self):
        return OrderedDict(zip(self.raw._blob_names, self.raw._blobs))

    @property
    def inputs(self):
        return [list(self.blobs.keys())[i] for i in self.raw._inputs]

    @property
    def outputs(self):
        return [list(self.blobs.keys())[i] for i in self.raw._outputs]

    def _id_names(self, func):
        names = list(self.blobs)
        return OrderedDict((self.raw._layer_names[i], [names[j] for j in func(i)])
                           for i in range(len(self.raw.layers)))

    @property
    def top_names(self):
        return self._id_names(self.raw._top_ids)

    @property
    def bottom_names(self):
        return self._id_names(self.raw._bottom_ids)

    # ------------------------------------------ net.cpp's ForwardFromTo/BackwardFromTo
    def _forward(self, start, end):
        assert start >= 0 and end < len(self.raw.layers)     # CHECK_GE, CHECK_LT
        self.ran += [("f", i) for i in range(start, end + 1)]
        self.raw._forward(start, end)

    def _backward(self, start, end):
        assert end >= 0 and start < len(self.raw.layers)
        self.ran += [("b", i) for i in range(start, end - 1, -1)]
        self.raw._backward(start, end)

    # ---------------------------------------------------------------- pycaffe.py
    def forward(self, blobs=None, start=None, end=None, **kwargs):
        if blobs is None:
            blobs = []
        start_ind = list(self.raw._layer_names).index(start) if start is not None else 0
        if end is not None:
            end_ind = list(self.raw._layer_names).index(end)
            outputs = set(self.top_names[end] + blobs)
        else:
            end_ind = len(self.raw.layers) - 1
            outputs = set(self.outputs + blobs)
        # minicaffe (README): an unknown name in blobs fails before the pass (pycaffe: after)
        for n in blobs:
            self.blobs[n]
        if kwargs:
            if set(kwargs.keys()) != set(self.inputs):
                raise Exception('Input blob arguments do not match net inputs.')
            for in_, blob in kwargs.items():
                if blob.shape[0] != self.blobs[in_].shape[0]:
                    raise Exception('Input is not batch sized')
                self.blobs[in_].data[...] = blob
        self._forward(start_ind, end_ind)
        return {out: self.blobs[out].data for out in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        if diffs is None:
            diffs = []
        start_ind = (list(self.raw._layer_names).index(start) if start is not None
                     else len(self.raw.layers) - 1)
        if end is not None:
            end_ind = list(self.raw._layer_names).index(end)
            outputs = set(self.bottom_names[end] + diffs)
        else:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        for n in diffs:         # minicaffe (README), as forward's blobs
            self.blobs[n]
        if kwargs:
            if set(kwargs.keys()) != set(self.outputs):
                raise Exception('Top diff arguments do not match net outputs.')
            for top, diff in kwargs.items():
                if diff.shape[0] != self.blobs[top].shape[0]:
                    raise Exception('Diff is not batch sized')
                self.blobs[top].diff[...] = diff
        self._backward(start_ind, end_ind)
        return {out: self.blobs[out].diff for out in outputs}

    def _batch(self, blobs):
        if not blobs:       # Python 2's pycaffe: next() stops the generator; 3.7: RuntimeError
            return          # minicaffe (README) keeps the Python 2 meaning
        num = len(next(iter(blobs.values())))
        batch_size = next(iter(self.blobs.values())).shape[0]
        remainder = num % batch_size
        num_batches = num // batch_size
        for b in range(num_batches):
            i = b * batch_size
            yield {name: blobs[name][i:i + batch_size] for name in blobs}
        if remainder > 0:
            padded_batch = {}
            for name in blobs:
                padding = np.zeros((batch_size - remainder,) + blobs[name].shape[1:])
                padded_batch[name] = np.concatenate([blobs[name][-remainder:], padding])
            yield padded_batch

    @staticmethod
    def _collect(into, outs):
        for out, arr in outs.items():
            if arr.ndim == 0:
                # minicaffe (README): one value per batch; pycaffe's extend() of a 0-d
                # array is a TypeError, so its forward_all fails on a net with a loss output
                into[out].append(arr.copy())
            else:
                into[out].extend(arr.copy())

    @staticmethod
    def _cut(all_, num):
        # pycaffe: pad = len(first output) - len(first kwarg), cut from all of them;
        # minicaffe (README): not from the per-batch scalars, and from every array
        for out in all_:
            all_[out] = np.asarray(all_[out])
            if all_[out].ndim and len(all_[out]) > num:
                all_[out] = all_[out][:num]

    def forward_all(self, blobs=None, **kwargs):
        all_outs = {out: [] for out in set(self.outputs + (blobs or []))}
        for batch in self._batch(kwargs):
            self._collect(all_outs, self.forward(blobs=blobs, **batch))
        if not kwargs:
            next(iter(kwargs.values()))     # pycaffe fails here (StopIteration)
        self._cut(all_outs, len(next(iter(kwargs.values()))))
        return all_outs

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        if not kwargs or set(kwargs) - set(self.inputs) - set(self.outputs):
            raise Exception("minicaffe (README): refuses unknown names; pycaffe ignores them")
        all_outs = {out: [] for out in set(self.outputs + (blobs or []))}
        all_diffs = {diff: [] for diff in set(self.inputs + (diffs or []))}
        forward_batches = self._batch({in_: kwargs[in_] for in_ in self.inputs if in_ in kwargs})
        backward_batches = self._batch({out: kwargs[out] for out in self.outputs
                                        if out in kwargs})
        for fb, bb in zip_longest(forward_batches, backward_batches, fillvalue={}):
            self._collect(all_outs, self.forward(blobs=blobs, **fb))
            self._collect(all_diffs, self.backward(diffs=diffs, **bb))
        num = len(next(iter(kwargs.values())))
        self._cut(all_outs, num)
        self._cut(all_diffs, num)
        return all_outs, all_diffs


# ---------------------------------------------------------------- random calls
def arrays(rng, net, names, batch=None, kind="ok"):
    """{name: array} for ``names``: the blob's shape, or a wrong batch, a broadcastable
    shape, a shape that does not fit, a 0-d array."""
    out = {}
    for n in names:
        shape = tuple(net.blobs[n].shape)
        if batch is not None:
            shape = (batch,) + shape[1:]
        k = kind if rng.random() < 0.6 else "ok"
        if n == "label":    # labels SoftmaxWithLoss takes
            out[n] = rng.integers(0, 3, shape or ()).astype(np.float32)
            continue
        if k == "batch" and shape:
            shape = (shape[0] + int(rng.choice([-1, 1])),) + shape[1:]
        elif k == "broadcast" and len(shape) > 1:
            shape = shape[:1] + (1,) * (len(shape) - 1)
        elif k == "misfit" and len(shape) > 1:
            shape = shape[:-1] + (shape[-1] + 1,)
        elif k == "scalar":
            shape = ()
        out[n] = rng.standard_normal(shape).astype(np.float32)
    return out


def random_call(rng, net):
    """(method name, args, kwargs) of one random call."""
    layers = list(net.layer_names) + ["nope"]
    blob_names = list(net.blobs) + ["ghost"]

    def name():
        return None if rng.random() < 0.3 else str(rng.choice(layers[:-1] if rng.random() < 0.9
                                                               else layers))

    def extra():
        if rng.random() < 0.4:
            return None
        pool = blob_names if rng.random() < 0.1 else blob_names[:-1]
        return [str(b) for b in rng.choice(pool, size=int(rng.integers(0, 3)))]

    kinds = ["ok", "ok", "ok", "batch", "broadcast", "misfit", "scalar"]
    what = rng.choice(["forward", "forward", "backward", "backward", "forward_all",
                       "forward_backward_all"])
    kind = str(rng.choice(kinds))
    if what in ("forward", "backward"):
        names = list(net.inputs if what == "forward" else net.outputs)
        kw = {}
        r = rng.random()
        if r < 0.55:
            kw = arrays(rng, net, names, kind=kind)
        elif r < 0.7:
            kw = arrays(rng, net, names[:-1] + [str(rng.choice(blob_names[:-1]))], kind=kind)
        extra_key = "blobs" if what == "forward" else "diffs"
        return what, dict(kw, **{extra_key: extra(), "start": name(), "end": name()})
    num = int(rng.integers(0, 3 * net.blobs[net.inputs[0]].shape[0] + 2))
    # arrays of one length (of unequal ones, pycaffe slices by the first's and gives rows
    # of the others that do not belong together; minicaffe (README) refuses them)
    kind = str(rng.choice(["ok", "ok", "broadcast", "misfit"]))
    if what == "forward_all":
        kw = arrays(rng, net, net.inputs, batch=num, kind=kind) if rng.random() < 0.95 else {}
        return what, dict(kw, blobs=extra())
    names = list(net.inputs if rng.random() < 0.85 else []) + \
        list(net.outputs if rng.random() < 0.35 else [])
    kw = arrays(rng, net, names, batch=num, kind=kind)
    return what, dict(kw, blobs=extra(), diffs=extra())


def run(target, what, kwargs):
    try:
        return "ok", getattr(target, what)(**kwargs)
    except Exception as e:      # pycaffe raises bare Exceptions; which kind is not compared
        return "raised", e


def state(net):
    blobs = {n: (b.data.copy(), b.diff.copy()) for n, b in net.blobs.items()}
    params = {n: [p.diff.copy() for p in ps] for n, ps in net.params.items()}
    return blobs, params


def assert_same_state(net, ref):
    (nb, npar), (rb, rpar) = state(net), state(ref)
    assert list(nb) == list(rb)
    for n in nb:
        np.testing.assert_array_equal(nb[n][0], rb[n][0], err_msg=f"data of {n}")
        np.testing.assert_array_equal(nb[n][1], rb[n][1], err_msg=f"diff of {n}")
    for n in npar:
        for a, b in zip(npar[n], rpar[n]):
            np.testing.assert_array_equal(a, b, err_msg=f"param diff of {n}")


def assert_same_result(net, what, got, want):
    pairs = [(got, want, "data")] if what in ("forward", "forward_all", "backward") else \
        [(got[0], want[0], "data"), (got[1], want[1], "diff")]
    if what == "backward":
        pairs = [(got, want, "diff")]
    for g, w, field in pairs:
        assert sorted(g) == sorted(w)
        for n in g:
            np.testing.assert_array_equal(np.asarray(g[n]), np.asarray(w[n]), err_msg=n)
            own = getattr(net.blobs[n], field)
            if what in ("forward", "backward"):
                # pycaffe returns blob.data / blob.diff: views that the next pass overwrites
                assert np.shares_memory(g[n], own), n
            else:
                assert not np.shares_memory(g[n], own), n   # copies (out_blob.copy())


SEEDS = {"two_in": 11, "loss": 12, "dup": 13}
CALLS = {"two_in": 40, "loss": 50, "dup": 30}


@pytest.mark.parametrize("which", sorted(NETS))
def test_calls_match_pycaffe(which):
    rng = np.random.default_rng(SEEDS[which])
    net, ref_net = pair(NETS[which])
    ref = Ref(ref_net)
    ran = []
    net.before_forward(lambda i: ran.append(("f", i)))
    net.before_backward(lambda i: ran.append(("b", i)))
    seen = set()
    for call in range(CALLS[which]):
        what, kwargs = random_call(rng, net)
        ran.clear()
        ref.ran.clear()
        got = run(net, what, kwargs)
        want = run(ref, what, kwargs)
        where = f"call {call}: {what}({', '.join(f'{k}=' for k in kwargs)}) -> {want[1]!r}"
        assert got[0] == want[0], f"{where}; minicaffe: {got[1]!r}"
        seen.add((what, got[0]))
        if got[0] == "ok":
            assert_same_result(net, what, got[1], want[1])
            assert ran == ref.ran, where
        assert_same_state(net, ref_net)
    # the fuzz reached both outcomes of the single calls
    assert {("forward", "ok"), ("forward", "raised"), ("backward", "ok"), ("forward_all", "ok"),
            ("forward_backward_all", "ok")} <= seen


# ------------------------------------------------------ the disagreements, kept
def test_end_names_a_layer_two_layers_share():
    """pycaffe: ``end_ind = list(self._layer_names).index(end)`` (the first layer of the
    name) but ``outputs = set(self.top_names[end] + blobs)``, and top_names is an
    OrderedDict keyed by layer name: the last layer's tops."""
    net = build(DUP)
    x = np.ones((2, 3), np.float32)
    seen = []
    net.before_forward(seen.append)
    out = net.forward(end="act", x=x)
    assert seen == [0, 1] and sorted(out) == ["t"]
    seen.clear()
    net.before_backward(seen.append)
    assert sorted(net.backward(start="act", end="act")) == ["z"]   # bottom_names["act"]
    assert seen == [1]


def test_a_blob_without_axes_is_not_batch_sized():
    """pycaffe's ``diff.shape[0] != self.blobs[top].shape[0]`` fails (IndexError) for a
    loss top, which has 0 axes (LossLayer::Reshape), and for a 0-d array: a loss diff is
    set through ``net.blobs['loss'].diff``, not by name."""
    net = build(LOSS)
    rng = np.random.default_rng(0)
    net.forward(data=rng.standard_normal((3, 1, 4, 4)).astype(np.float32),
                label=np.array([0, 1, 2], np.float32))
    prob = np.ones((3, 3), np.float32)
    for loss in (np.float32(1), np.ones(1, np.float32), np.ones(3, np.float32)):
        with pytest.raises(ValueError, match="not batch sized"):
            net.backward(loss=loss, prob=prob)
    with pytest.raises(ValueError, match="not batch sized"):
        net.forward(data=np.float32(1), label=np.zeros(3, np.float32))
