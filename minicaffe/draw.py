"""Drawing a NetParameter as a Graphviz graph (pycaffe's ``caffe.draw``).

The graph is the one BVLC Caffe's python/caffe/draw.py builds, node for node and
edge for edge, so the DOT text is the same:

* each layer is a ``record`` node named by its label, ``"name\\n(Type)"`` (with
  ``kernel size``, ``stride`` and ``pad`` for Convolution, Deconvolution and
  Pooling, and the pooling method as ``(Pooling MAX)``).  Words are separated by
  ``\\n`` when the graph runs left-right and by a space when it runs top-bottom;
* an in-place layer (one bottom, the same one top: ReLU, Dropout...) is light
  green; other layers are coloured by type (Convolution and Deconvolution red,
  Pooling orange, InnerProduct purple, the rest blue);
* each blob is a node named by the blob; a blob that a later layer reads is a grey
  octagon, one that no later layer reads (the loss, say) is a plain ellipse,
  because upstream keeps the last node made for a name and only bottoms are styled;
* an edge runs bottom blob -> layer (no label) and layer -> top blob, labelled with
  ``Batch N`` for Data, ``num_output`` for Convolution, Deconvolution and
  InnerProduct (``label_edges=False`` leaves them empty).

Layers whose name and type coincide (the TRAIN and TEST ``data`` layers of a
train_val net) are one node, as upstream; pass ``phase`` to draw one phase.

pydot is optional and imported on first use (``pip install pydot``).  Rendering to
an image (png, svg, pdf...) runs Graphviz's ``dot`` program; writing ``.dot`` or
``.raw`` gives the DOT text itself and needs neither ``dot`` nor a layout.
"""
from __future__ import annotations

import os
import shutil

from .proto import caffe_pb2

# Node styles (upstream's names and values).
LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}

# Extensions written as DOT source, without running Graphviz.
DOT_TEXT_FORMATS = ("dot", "raw")

_LEARNING_TYPES = ("Convolution", "Deconvolution", "InnerProduct")
_SPATIAL_TYPES = ("Convolution", "Deconvolution", "Pooling")


def _pydot():
    """The pydot module, imported on first use: minicaffe does not need it otherwise."""
    try:
        import pydot
    except ImportError as e:
        raise ImportError("caffe.draw needs pydot, which is not installed: pip install pydot "
                          "(rendering images also needs Graphviz's `dot` program; "
                          "writing .dot or .raw does not)") from e
    return pydot


def get_pooling_types_dict() -> dict[int, str]:
    """PoolingParameter.PoolMethod's values by number: ``{0: 'MAX', 1: 'AVE', 2: 'STOCHASTIC'}``."""
    enum = caffe_pb2.PoolingParameter.DESCRIPTOR.enum_types_by_name["PoolMethod"]
    return {value.number: name for name, value in enum.values_by_name.items()}


def get_edge_label(layer) -> str:
    """The label of the edges from ``layer`` to its tops: the batch size of a Data layer,
    the number of outputs of a Convolution, Deconvolution or InnerProduct layer, else
    ``'""'`` (an empty DOT string)."""
    if layer.type == "Data":
        return "Batch %s" % layer.data_param.batch_size
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer) -> tuple[float, float]:
    """(weight, bias) learning-rate multipliers of a Convolution, Deconvolution or
    InnerProduct layer; a missing ``param`` counts as 1.0 (Caffe's default)."""
    if layer.type not in _LEARNING_TYPES:
        raise ValueError("%s layers do not have a learning rate multiplier" % layer.type)
    params = layer.param
    if len(params) > 2:
        raise ValueError("Could not parse the learning rate multiplier")
    mults = [p.lr_mult for p in params] + [1.0] * (2 - len(params))
    return mults[0], mults[1]


def _spatial_descriptor(layer, separator: str) -> str:
    # Upstream reads kernel_size/stride/pad only (kernel_h, kernel_w and global_pooling
    # are not shown); a repeated convolution field shows its first value or Caffe's default.
    if layer.type == "Pooling":
        p = layer.pooling_param
        kernel, stride, pad = p.kernel_size, p.stride, p.pad
    else:
        p = layer.convolution_param
        kernel = p.kernel_size[0] if len(p.kernel_size) else 1
        stride = p.stride[0] if len(p.stride) else 1
        pad = p.pad[0] if len(p.pad) else 0
    return separator.join(["kernel size: %d" % kernel, "stride: %d" % stride, "pad: %d" % pad])


def get_layer_label(layer, rankdir: str, display_lrm: bool = False) -> str:
    """The node label (and DOT name) of ``layer``, in double quotes so that the colons of
    ``kernel size: 3`` parse: ``"conv1\\n(Convolution)\\nkernel size: 3\\nstride: 1\\npad: 1"``.

    A vertical graph (``rankdir`` TB or BT) has room across, so words are separated by
    spaces; any other direction separates them with DOT's ``\\n``.  ``display_lrm`` adds
    ``lr mult: W, B`` to a learning layer unless both multipliers are zero.
    """
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    descriptors = [layer.name]
    if layer.type == "Pooling":
        method = get_pooling_types_dict()[layer.pooling_param.pool]
        descriptors.append("(%s %s)" % (layer.type, method))
    else:
        descriptors.append("(%s)" % layer.type)
    if layer.type in _SPATIAL_TYPES:
        descriptors.append(_spatial_descriptor(layer, separator))
    if display_lrm and layer.type in _LEARNING_TYPES:
        weight_mult, bias_mult = get_layer_lr_mult(layer)
        if weight_mult or bias_mult:
            descriptors.append("lr mult: %.1f, %.1f" % (weight_mult, bias_mult))
    return '"%s"' % separator.join(descriptors)


def choose_color_by_layertype(layertype: str) -> str:
    """The fill colour of a (not in-place) layer of type ``layertype``."""
    if layertype in ("Convolution", "Deconvolution"):
        return "#FF5050"
    if layertype == "Pooling":
        return "#FF9900"
    if layertype == "InnerProduct":
        return "#CC33FF"
    return "#6495ED"


def _phase_number(phase):
    """caffe.TRAIN/caffe.TEST (or their names) as the Phase number; None stays None."""
    if phase is None:
        return None
    if isinstance(phase, str):
        names = caffe_pb2.Phase.keys()
        if phase not in names:
            raise ValueError("unknown phase %r: expected one of %s or None (all layers)"
                             % (phase, ", ".join(names)))
        return caffe_pb2.Phase.Value(phase)
    if phase not in caffe_pb2.Phase.values():
        raise ValueError("unknown phase %r: expected caffe.TRAIN (%d), caffe.TEST (%d) or None "
                         "(all layers)" % (phase, caffe_pb2.TRAIN, caffe_pb2.TEST))
    return int(phase)


def _in_phase(layer, phase: int) -> bool:
    """Whether ``layer`` is drawn for ``phase``: upstream's reading of include/exclude, which
    looks at the rules' phase only (a rule without one reads as TRAIN, the field's default;
    stages and levels are not considered, unlike Net's filter)."""
    if len(layer.include) and len(layer.exclude):
        raise ValueError("layer %s has both include and exclude specified." % layer.name)
    if len(layer.include):
        return any(rule.phase == phase for rule in layer.include)
    return not any(rule.phase == phase for rule in layer.exclude)


def get_pydot_graph(caffe_net, rankdir: str, label_edges: bool = True, phase=None,
                    display_lrm: bool = False):
    """A ``pydot.Dot`` digraph of ``caffe_net`` (a NetParameter; its ``layer`` field, so
    upgrade V1 nets first), laid out in direction ``rankdir`` (LR, RL, TB, BT).

    ``phase`` (caffe.TRAIN or caffe.TEST) keeps the layers of that phase; None keeps all.
    """
    pydot = _pydot()
    phase = _phase_number(phase)
    graph = pydot.Dot(caffe_net.name if caffe_net.name else "Net", graph_type="digraph",
                      rankdir=rankdir)
    # One node per key, the last made for it winning (insertion order kept), as upstream:
    # that decides each node's style and the order of nodes in the DOT text.
    nodes = {}
    edges = []  # (source key, destination key, label)
    for layer in caffe_net.layer:
        if phase is not None and not _in_phase(layer, phase):
            continue
        label = get_layer_label(layer, rankdir, display_lrm=display_lrm)
        key = "%s_%s" % (layer.name, layer.type)
        in_place = (len(layer.bottom) == 1 and len(layer.top) == 1
                    and layer.bottom[0] == layer.top[0])
        if in_place:
            style = NEURON_LAYER_STYLE
        else:
            style = dict(LAYER_STYLE_DEFAULT, fillcolor=choose_color_by_layertype(layer.type))
        nodes[key] = pydot.Node(label, **style)
        for bottom in layer.bottom:
            nodes[bottom + "_blob"] = pydot.Node(bottom, **BLOB_STYLE)
            edges.append((bottom + "_blob", key, '""'))
        for top in layer.top:
            nodes[top + "_blob"] = pydot.Node(top)
            edges.append((key, top + "_blob", get_edge_label(layer) if label_edges else '""'))
    for node in nodes.values():
        graph.add_node(node)
    for source, destination, label in edges:
        graph.add_edge(pydot.Edge(nodes[source], nodes[destination], label=label))
    return graph


def _render(graph, ext: str) -> bytes:
    if ext in DOT_TEXT_FORMATS:
        # The DOT source itself, before layout (Graphviz's -Tdot would add positions).
        return graph.to_string().encode("utf-8")
    if shutil.which("dot") is None:
        raise FileNotFoundError(
            "rendering a net to %r needs Graphviz's `dot` program, which is not on PATH "
            "(apt-get install graphviz, or brew install graphviz); a .dot or .raw file gives "
            "the DOT text without it" % ext)
    try:
        return graph.create(prog="dot", format=ext)
    except AssertionError as e:  # pydot's way of saying that dot exited non-zero
        raise RuntimeError("Graphviz's dot could not render the net as %r (an unknown format?): %s"
                           % (ext, e)) from None


def draw_net(caffe_net, rankdir: str, ext: str = "png", phase=None,
             display_lrm: bool = False) -> bytes:
    """``caffe_net`` drawn in format ``ext`` (png, svg, pdf... through Graphviz; ``dot`` and
    ``raw`` give the DOT text), as bytes."""
    graph = get_pydot_graph(caffe_net, rankdir, phase=phase, display_lrm=display_lrm)
    return _render(graph, ext)


def draw_net_to_file(caffe_net, filename, rankdir: str = "LR", phase=None,
                     display_lrm: bool = False) -> None:
    """Draw ``caffe_net`` into ``filename`` in the format its extension names: ``net.png``,
    ``net.svg``..., or ``net.dot``/``net.raw`` for the DOT text (to feed Graphviz by hand)."""
    filename = os.fspath(filename)
    base = os.path.basename(filename)
    if "." not in base:
        raise ValueError("%s: the extension names the format (net.png, net.svg, net.dot...), "
                         "and this file name has none" % filename)
    ext = base[base.rfind(".") + 1:]
    data = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    with open(filename, "wb") as f:
        f.write(data)
