"""A seeded fuzz of Net construction bookkeeping against a reference written from BVLC Caffe.

The reference below re-states, in plain Python over an abstract layer list (not over
minicaffe's parsed NetParameter), what Caffe's source does:

- ``Net::FilterNet`` / ``Net::StateMeetsRule`` (src/caffe/net.cpp): a layer without include
  rules is kept unless an exclude rule is met; one with include rules is kept when one is met;
  a rule fails on phase, min_level, max_level, a missing stage or a present not_stage.
- ``InsertSplits`` (src/caffe/util/insert_splits.cpp): readers counted per (layer, top) of the
  last writer, an explicit nonzero loss weight counting as one more reader; a Split named
  ``SplitLayerName`` after the writer, tops ``SplitBlobName``; a loss-weighted top's split
  carries ``[w, 0, ...]``, the writer's loss weights are cleared and readers start at split 1.
- ``Net::Init`` with ``AppendTop`` (a new blob per non-in-place top, "Duplicate blobs produced
  by multiple sources" otherwise), ``AppendBottom`` (bottom_need_backward = the blob's need,
  replaced by propagate_down when given), params' ``lr_mult != 0``, ``blob_need_backward_``
  set for the tops of a layer that needs backward, ``blob_loss_weights_[top] = layer->loss``,
  the backward pruning over ``blobs_under_loss`` / ``blobs_skip_backp``, then force_backward
  (``AllowForceBackward``: false for a loss layer's label), and ``net_output_blobs_`` in the
  order of the ``std::set`` of available blobs.
- Layer::SetLossWeights and LossLayer::LayerSetUp: a loss layer without loss_weight weighs
  top 0 by 1 (also after InsertSplits cleared its weights).

Each of the 100 cases: a random NetState (phase, level, stages, plus stages from the file's own
``state { }``), 1-3 source layers (Input, DummyData; 1-3 tops; a label DummyData), 3-9 layers
among InnerProduct (0-2 ParamSpecs, lr_mult 0/1/2/-1), ReLU (half in place, sometimes on a
loss top), Eltwise (sometimes in place), Concat,
Slice, Silence, EuclideanLoss, SoftmaxWithLoss (some without a top: "(automatic)"), with fan-out (splits), loss_weight on loss and
non-loss layers and on multi-top layers, propagate_down, include/exclude rules, layers that
the state filters out (some of them redefining a kept blob), and force_backward on or off.
Some nets put an in-place layer after a fan-out: Caffe refuses those (AppendTop), and so must
minicaffe.

Compared: layer names and types, blob names in order, bottoms and tops per layer, the need
for backward of each layer, bottom and blob, param_propagate_down, each blob's loss weight,
the outputs; and the observable effect: after a forward, every diff not holding a loss
weight is filled with a sentinel of its own, and a backward must write exactly the bottoms
that Caffe's BackwardFromTo would (layer_need_backward and bottom_need_backward).
"""
import random

import numpy as np
import pytest

from minicaffe.net import TEST, TRAIN, Net
from test_caffe_spec_net import P     # the Caffe-spec tests' parser of a test net

SEED = 20250611
N_CASES = 100
N = 2                                 # every blob is (N, d); a label is (N,)
STAGES = ("a", "b", "c")
LOSS_TYPES = ("EuclideanLoss", "SoftmaxWithLoss")


# ------------------------------------------------------------------ the generator
class Layer:
    def __init__(self, name, type_, bottom=(), top=(), **kw):
        self.name, self.type = name, type_
        self.bottom, self.top = list(bottom), list(top)
        self.loss_weight = kw.pop("loss_weight", [])
        self.propagate_down = kw.pop("propagate_down", [])
        self.lr_mults = kw.pop("lr_mults", [])       # ParamSpecs given (InnerProduct)
        self.include = kw.pop("include", [])          # rules: dicts of NetStateRule fields
        self.exclude = kw.pop("exclude", [])
        self.body = kw.pop("body", "")                # the type's own parameter block
        assert not kw, kw

    def text(self):
        out = [f"layer {{ name: '{self.name}' type: '{self.type}'"]
        out += [f"bottom: '{b}'" for b in self.bottom] + [f"top: '{t}'" for t in self.top]
        out += [f"loss_weight: {w}" for w in self.loss_weight]
        out += [f"propagate_down: {str(p).lower()}" for p in self.propagate_down]
        out += [f"param {{ lr_mult: {m} }}" for m in self.lr_mults]
        for kind, rules in (("include", self.include), ("exclude", self.exclude)):
            for r in rules:
                fields = []
                for k, v in r.items():
                    for x in (v if isinstance(v, list) else [v]):
                        fields.append(f"{k}: '{x}'" if "stage" in k else f"{k}: {x}")
                out.append(f"{kind} {{ {' '.join(fields)} }}")
        out.append(self.body + " }")
        return "\n  ".join(out)


def meets(state, rule):
    """Net::StateMeetsRule."""
    phase, level, stages = state
    if "phase" in rule and rule["phase"] != ("TRAIN", "TEST")[phase]:
        return False
    if "min_level" in rule and level < rule["min_level"]:
        return False
    if "max_level" in rule and level > rule["max_level"]:
        return False
    if any(s not in stages for s in rule.get("stage", [])):
        return False
    return not any(s in stages for s in rule.get("not_stage", []))


def kept(state, layer):
    """Net::FilterNet for one layer."""
    if layer.include:
        return any(meets(state, r) for r in layer.include)
    return not any(meets(state, r) for r in layer.exclude)


def random_rule(rng):
    rule = {}
    while not rule:
        if rng.random() < 0.4:
            rule["phase"] = rng.choice(("TRAIN", "TEST"))
        if rng.random() < 0.3:
            rule["min_level"] = rng.randint(-1, 3)
        if rng.random() < 0.3:
            rule["max_level"] = rng.randint(-1, 3)
        if rng.random() < 0.4:
            rule["stage"] = rng.sample(STAGES, rng.randint(1, 2))
        if rng.random() < 0.3:
            rule["not_stage"] = rng.sample(STAGES, 1)
    return rule


def generate(case):
    """One random net: (prototxt text, Net keyword arguments, the reference's NetState)."""
    rng = random.Random(SEED * 1000 + case)
    phase = rng.choice((TRAIN, TEST))
    level = rng.randint(-1, 3)
    given = rng.sample(STAGES, rng.randint(0, 2))
    in_file = [s for s in rng.sample(STAGES, rng.randint(0, 1)) if s not in given]
    state = (phase, level, set(given) | set(in_file))
    read = set()                             # live blobs that a kept layer reads
    layers, live = [], {}                    # live: blob name -> d (0 for a label)
    counter = iter(range(1000))

    def new_blob(prefix="b"):
        return f"{prefix}{next(counter)}"

    def weights(k):
        return [rng.choice((0, 0.5, 1, 2)) for _ in range(k)]

    def add(layer, dims):
        """Give ``layer`` random rules; a layer the state filters out makes blobs of its own
        (or, now and then, a kept blob's name again) that no kept layer reads."""
        if rng.random() < 0.3:
            rules = [random_rule(rng) for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.5:
                layer.include = rules
            else:
                layer.exclude = rules
        if not kept(state, layer):
            if live and rng.random() < 0.4 and layer.top:
                layer.top[0] = rng.choice(sorted(live))
            layers.append(layer)
            return
        layers.append(layer)
        read.update(layer.bottom)
        for t, d in zip(layer.top, dims):
            live[t] = d
            read.discard(t)

    # sources
    for s in range(rng.randint(1, 2)):
        k = rng.randint(1, 3)
        dims = [rng.choice((2, 4, 6)) for _ in range(k)]
        tops = [new_blob("in") for _ in range(k)]
        lw = weights(k) if rng.random() < 0.1 else []
        if rng.random() < 0.5:
            shapes = " ".join(f"shape {{ dim: {N} dim: {d} }}" for d in dims)
            body = f"input_param {{ {shapes} }}"
            layer = Layer(f"src{s}", "Input", top=tops, loss_weight=lw, body=body)
        else:
            shapes = " ".join(f"shape {{ dim: {N} dim: {d} }}" for d in dims)
            body = (f"dummy_data_param {{ {shapes} "
                    "data_filler { type: 'gaussian' std: 1 } }")
            layer = Layer(f"src{s}", "DummyData", top=tops, loss_weight=lw, body=body)
        add(layer, dims)
    if rng.random() < 0.6:
        add(Layer("labels", "DummyData", top=["label"],
                  body=f"dummy_data_param {{ shape {{ dim: {N} }} "
                       "data_filler { type: 'constant' value: 0 } }"), [0])

    def data_blobs():
        return sorted(n for n, d in live.items() if d > 0)

    def scalars():                       # loss tops (shape ()), read now and then
        return sorted(n for n, d in live.items() if d < 0)

    for li in range(rng.randint(3, 9)):
        name = f"L{li}"
        if not data_blobs():
            break
        kind = rng.choice(("InnerProduct", "InnerProduct", "ReLU", "ReLU", "Eltwise", "Concat",
                           "Slice", "Silence", "EuclideanLoss", "SoftmaxWithLoss"))
        b = rng.choice(data_blobs())
        lw = weights(1) if rng.random() < 0.25 else []
        pd = None
        if kind == "InnerProduct":
            d = rng.choice((2, 4))
            lr = [rng.choice((0, 0, 1, 2, -1)) for _ in range(rng.randint(0, 2))]
            body = (f"inner_product_param {{ num_output: {d} "
                    "weight_filler { type: 'gaussian' std: 1 } "
                    "bias_filler { type: 'gaussian' std: 1 } }")
            layer = Layer(name, kind, [b], [new_blob()], loss_weight=lw, lr_mults=lr, body=body)
            dims = [d]
        elif kind == "ReLU":
            if scalars() and rng.random() < 0.6:
                b = rng.choice(scalars())
            # in place after a fan-out is an error (below); most in-place layers avoid it
            in_place = rng.random() < 0.5 and (b not in read or rng.random() < 0.25)
            top = b if in_place else new_blob()
            layer = Layer(name, kind, [b], [top], loss_weight=lw)
            dims = [live[b]]
        elif kind in ("Eltwise", "Concat"):
            same = [n for n in data_blobs() if live[n] == live[b]] if kind == "Eltwise" \
                else data_blobs()
            bottoms = [b] + [rng.choice(same) for _ in range(rng.randint(1, 2))]
            in_place = (kind == "Eltwise" and rng.random() < 0.2     # top 0 over bottom 0
                        and b not in read and b not in bottoms[1:])
            layer = Layer(name, kind, bottoms, [b if in_place else new_blob()], loss_weight=lw)
            dims = [live[b] if kind == "Eltwise" else sum(live[x] for x in bottoms)]
        elif kind == "Slice":
            evens = [n for n in data_blobs() if live[n] % 2 == 0]
            b = rng.choice(evens)
            lw = weights(2) if lw else []
            layer = Layer(name, kind, [b], [new_blob(), new_blob()], loss_weight=lw,
                          body="slice_param { axis: 1 }")
            dims = [live[b] // 2] * 2
        elif kind == "Silence":
            pool = data_blobs() + scalars()
            bottoms = rng.sample(pool, min(len(pool), rng.randint(1, 2)))
            layer = Layer(name, kind, bottoms)
            lw, dims = [], []
        elif kind == "EuclideanLoss":
            same = [n for n in data_blobs() if live[n] == live[b]]
            layer = Layer(name, kind, [b, rng.choice(same)], [new_blob("loss")])
            dims = [-1]
        else:
            if "label" not in live:
                continue
            layer = Layer(name, kind, [b, "label"], [new_blob("loss")])
            pd = [rng.random() < 0.5, False]     # SoftmaxWithLoss cannot backward to labels
            dims = [-1]
        if kind in LOSS_TYPES and rng.random() < 0.4:
            lw = [rng.choice((0, 1, 3))]
        if kind in LOSS_TYPES and rng.random() < 0.15:
            layer.top = []            # Net::Init gives it an anonymous "(automatic)" top
        layer.loss_weight = lw if len(lw) == max(len(layer.top), kind in LOSS_TYPES) else []
        if layer.bottom and (pd or rng.random() < (0.5 if kind in LOSS_TYPES else 0.25)):
            layer.propagate_down = pd or [rng.random() < 0.5 for _ in layer.bottom]
        add(layer, dims)
    if data_blobs() and rng.random() < 0.8:
        b = rng.choice(data_blobs())
        same = [n for n in data_blobs() if live[n] == live[b]]
        pd = [rng.random() < 0.5, rng.random() < 0.5] if rng.random() < 0.3 else []
        add(Layer("final", "EuclideanLoss", [b, rng.choice(same)], ["loss_final"],
                  propagate_down=pd), [-1])

    head = "name: 'fuzz%d'\n" % case
    if rng.random() < 0.4:
        head += "force_backward: true\n"
    if in_file or rng.random() < 0.2:      # the Net's level replaces the file's; stages add up
        head += "state { level: %d %s }\n" % (rng.randint(-2, 5),
                                             " ".join(f"stage: '{s}'" for s in in_file))
    text = head + "\n".join(layer.text() for layer in layers) + "\n"
    return text, dict(stages=given, level=level), phase, state, layers, "force_backward" in head


# ------------------------------------------------------------------ the reference
def split_layer_name(layer, blob, idx):
    return f"{blob}_{layer}_{idx}_split"


def split_blob_name(layer, blob, idx, k):
    return f"{blob}_{layer}_{idx}_split_{k}"


def insert_splits(layers):
    """InsertSplits over Layer objects (copies)."""
    last_top, source, count, loss_w, split_idx = {}, {}, {}, {}, {}
    for i, lp in enumerate(layers):
        for j, b in enumerate(lp.bottom):
            source[(i, j)] = last_top[b]
            count[last_top[b]] = count.get(last_top[b], 0) + 1
        for j, t in enumerate(lp.top):
            last_top[t] = (i, j)
        for j in range(min(len(lp.loss_weight), len(lp.top))):
            idx = last_top[lp.top[j]]
            loss_w[idx] = lp.loss_weight[j]
            if loss_w[idx]:
                count[idx] = count.get(idx, 0) + 1
    out = []
    for i, lp in enumerate(layers):
        new = Layer(lp.name, lp.type, lp.bottom, lp.top, loss_weight=list(lp.loss_weight),
                    propagate_down=list(lp.propagate_down), lr_mults=list(lp.lr_mults))
        out.append(new)
        for j in range(len(new.bottom)):
            idx = source[(i, j)]
            if count.get(idx, 0) > 1:
                k = split_idx.get(idx, 0)
                split_idx[idx] = k + 1
                new.bottom[j] = split_blob_name(layers[idx[0]].name, new.bottom[j], idx[1], k)
        for j, t in enumerate(new.top):
            c = count.get((i, j), 0)
            if c > 1:
                w = loss_w.get((i, j), 0)
                out.append(Layer(split_layer_name(lp.name, t, j), "Split", [t],
                                 [split_blob_name(lp.name, t, j, k) for k in range(c)],
                                 loss_weight=[w if k == 0 else 0 for k in range(c)] if w else []))
                if w:
                    new.loss_weight = []
                    split_idx[(i, j)] = split_idx.get((i, j), 0) + 1
    return out


class Duplicate(Exception):
    pass


def reference(layers, state, force_backward):
    """Net::Init's bookkeeping for the net ``layers`` under ``state``."""
    layers = insert_splits([lp for lp in layers if kept(state, lp)])
    blobs, blob_need, available = [], {}, set()
    bottom_need, layer_need, loss, ppd = [], [], [], []
    for lp in layers:
        need = False
        bneed = []
        for j, b in enumerate(lp.bottom):
            available.discard(b)
            nb = blob_need[b]
            if lp.propagate_down:
                nb = lp.propagate_down[j]
            bneed.append(nb)
            need |= blob_need[b]
        for j, t in enumerate(lp.top):
            if not (j < len(lp.bottom) and lp.bottom[j] == t):
                if t in blob_need:
                    raise Duplicate(t)
                blobs.append(t)
                blob_need[t] = False
            available.add(t)
        if lp.type in LOSS_TYPES and not lp.top:
            # AppendTop(param, layer_id, num_top, NULL, NULL): a blob "(automatic)", not
            # available to readers nor an output.  Caffe names each "(automatic)"; pycaffe's
            # net.blobs dict would keep one of them, minicaffe numbers the later ones.
            k = sum(b.startswith("(automatic)") for b in blobs)
            auto = "(automatic)" + (f"_{k}" if k else "")
            lp.top = [auto]
            blobs.append(auto)
            blob_need[auto] = False
        w = [float(x) for x in lp.loss_weight]
        if lp.type in LOSS_TYPES and not w:
            w = [1.0]
        loss.append(w + [0.0] * (len(lp.top) - len(w)))
        n_params = 2 if lp.type == "InnerProduct" else 0
        p = [(lp.lr_mults[k] if k < len(lp.lr_mults) else 1) != 0 for k in range(n_params)]
        need |= any(p)
        ppd.append(p)
        layer_need.append(need)
        bottom_need.append(bneed)
        if need:
            for t in lp.top:
                blob_need[t] = True
    under_loss, skip = set(), set()
    for i in range(len(layers) - 1, -1, -1):
        contributes, skip_prop = False, True
        for j, t in enumerate(layers[i].top):
            if loss[i][j] or t in under_loss:
                contributes = True
            if t not in skip:
                skip_prop = False
            if contributes and not skip_prop:
                break
        if layer_need[i] and skip_prop:
            layer_need[i] = False
            bottom_need[i] = [False] * len(bottom_need[i])
        if not contributes:
            layer_need[i] = False
        for j, b in enumerate(layers[i].bottom):
            if contributes:
                under_loss.add(b)
            else:
                bottom_need[i][j] = False
            if not bottom_need[i][j]:
                skip.add(b)
    if force_backward:
        for i, lp in enumerate(layers):
            layer_need[i] = True
            for j, b in enumerate(lp.bottom):
                allow = not (lp.type == "SoftmaxWithLoss" and j == 1)
                bottom_need[i][j] = bottom_need[i][j] or allow
                blob_need[b] = blob_need[b] or bottom_need[i][j]
            ppd[i] = [True] * len(ppd[i])
    blob_loss = {b: 0.0 for b in blobs}
    for lp, w in zip(layers, loss):
        for t, x in zip(lp.top, w):
            blob_loss[t] = x
    return dict(layers=layers, blobs=blobs, blob_need=blob_need, bottom_need=bottom_need,
                layer_need=layer_need, ppd=ppd, blob_loss=blob_loss,
                outputs=sorted(available))


# ------------------------------------------------------------------ the comparison
def check(case):
    text, kw, phase, state, layers, force = generate(case)
    try:
        ref = reference(layers, state, force)
    except Duplicate as e:
        with pytest.raises(ValueError, match="multiple sources"):
            Net(P(text), phase, dtype=np.float64, **kw)
        return "duplicate", str(e)
    net = Net(P(text), phase, dtype=np.float64, **kw)
    rl = ref["layers"]
    assert net.layer_names == [lp.name for lp in rl], text
    assert list(net._layer_names) == net.layer_names
    assert [layer.type for layer in net.layers] == [lp.type for lp in rl]
    assert list(net.blobs) == ref["blobs"], text
    assert list(net.bottom_names.values()) == [lp.bottom for lp in rl]
    assert list(net.top_names.values()) == [lp.top for lp in rl]
    assert net.layer_need_backward == ref["layer_need"], text
    assert net.bottom_need_backward == ref["bottom_need"], text
    assert dict(net.blob_need_backward) == ref["blob_need"], text
    assert [list(layer.param_propagate_down) for layer in net.layers] == ref["ppd"], text
    assert dict(net.blob_loss_weights) == ref["blob_loss"], text
    assert list(net.outputs) == ref["outputs"], text

    # the observable effect: which bottom diffs a backward writes
    rng = np.random.default_rng(case)
    for name in net.inputs:
        net.blobs[name].data[...] = rng.standard_normal(net.blobs[name].shape)
    net.forward_from_to()
    weighted = {t for li, lp in enumerate(rl) for ti, t in enumerate(lp.top)
                if net.layers[li].loss_weight(ti)}
    sentinel = {}
    for k, (name, blob) in enumerate(net.blobs.items()):
        if name not in weighted:
            sentinel[name] = 1000.25 + k
            blob.diff[...] = sentinel[name]
    written = {b for li, lp in enumerate(rl) if ref["layer_need"][li]
               for bi, b in enumerate(lp.bottom) if ref["bottom_need"][li][bi]}
    net.backward_from_to()
    for name, s in sentinel.items():
        touched = bool((np.asarray(net.blobs[name].diff) != s).any())
        assert touched == (name in written), (name, text)
    return "built", len(rl)


@pytest.mark.parametrize("case", range(N_CASES))
def test_net_bookkeeping_fuzz(case):
    check(case)


def test_the_fuzz_covers_what_it_says():
    """The seeded cases do reach splits, loss-weighted splits, filtered layers, force_backward,
    propagate_down, lr_mult 0 and the multiple-sources refusal."""
    seen = set()
    for case in range(N_CASES):
        text, kw, phase, state, layers, force = generate(case)
        dropped = [lp for lp in layers if not kept(state, lp)]
        seen |= {"filtered"} if dropped else set()
        seen |= {"force"} if force else set()
        seen |= {"propagate_down"} if any(lp.propagate_down for lp in layers) else set()
        seen |= {"lr0"} if any(0 in lp.lr_mults for lp in layers) else set()
        try:
            ref = reference(layers, state, force)
        except Duplicate:
            seen.add("duplicate")
            continue
        splits = [lp for lp in ref["layers"] if lp.type == "Split"]
        seen |= {"split"} if splits else set()
        seen |= {"weighted split"} if any(lp.loss_weight for lp in splits) else set()
        seen |= {"pruned"} if not all(ref["layer_need"]) else set()
        seen |= {"automatic"} if "(automatic)" in ref["blobs"] else set()
        # a loss top (weight 1 from LossLayer, not counted by InsertSplits) worked on in
        # place: blob_loss_weights_ then holds the in-place layer's 0
        seen |= {"in place over a loss"} if any(
            lp.type == "ReLU" and lp.top == lp.bottom and lp.top[0].startswith("loss")
            for lp in ref["layers"]) else set()
    assert seen == {"filtered", "force", "propagate_down", "lr0", "duplicate", "split",
                    "weighted split", "pruned", "automatic", "in place over a loss"}
