"""caffe.draw (minicaffe/draw.py) and python -m minicaffe.tools.draw_net.

Upstream's python/caffe/test/test_draw.py draws every net prototxt of the tree; here that is
every net under prototxt/ (tests/pycaffe_spec/test_spec_draw.py runs it through ``import
caffe``).  The rest checks the DOT text against what BVLC's draw.py builds: node labels per
layer type, edge labels, colours, blob styles, the phase filter and the file formats.
"""
import glob
import os
import re
import shutil
import sys

import pytest

pydot = pytest.importorskip("pydot")

from minicaffe import TEST, TRAIN, draw  # noqa: E402
from minicaffe.proto import caffe_pb2  # noqa: E402
from minicaffe.proto.text import parse_text, read_net_param  # noqa: E402
from minicaffe.tools.draw_net import main as draw_net_main  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(REPO, "prototxt", "digits", "train_val.prototxt")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (png/svg rendering)")

TINY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        param { lr_mult: 1 } param { lr_mult: 2 }
        convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
        inner_product_param { num_output: 10 } }
layer { name: "prob" type: "Softmax" bottom: "ip1" top: "prob" }
"""

# What BVLC's draw.get_pydot_graph(net, 'LR') gives for TINY (its pydot.Node/Edge calls,
# written out by pydot): nodes in first-made order, each blob styled by the last node made
# for it (an octagon if some layer reads it; `prob` only is a top), edges bottom->layer
# unlabelled and layer->top labelled with num_output.
TINY_DOT_LR = r"""digraph tiny {
rankdir=LR;
"data\n(Input)" [shape=record, fillcolor="#6495ED", style=filled];
data [shape=octagon, fillcolor="#E0E0E0", style=filled];
"conv1\n(Convolution)\nkernel size: 3\nstride: 2\npad: 1" [shape=record, fillcolor="#FF5050", style=filled];
conv1 [shape=octagon, fillcolor="#E0E0E0", style=filled];
"relu1\n(ReLU)" [shape=record, fillcolor="#90EE90", style=filled];
"pool1\n(Pooling AVE)\nkernel size: 2\nstride: 2\npad: 0" [shape=record, fillcolor="#FF9900", style=filled];
pool1 [shape=octagon, fillcolor="#E0E0E0", style=filled];
"ip1\n(InnerProduct)" [shape=record, fillcolor="#CC33FF", style=filled];
ip1 [shape=octagon, fillcolor="#E0E0E0", style=filled];
"prob\n(Softmax)" [shape=record, fillcolor="#6495ED", style=filled];
prob;
"data\n(Input)" -> data [label=""];
data -> "conv1\n(Convolution)\nkernel size: 3\nstride: 2\npad: 1" [label=""];
"conv1\n(Convolution)\nkernel size: 3\nstride: 2\npad: 1" -> conv1 [label=4];
conv1 -> "relu1\n(ReLU)" [label=""];
"relu1\n(ReLU)" -> conv1 [label=""];
conv1 -> "pool1\n(Pooling AVE)\nkernel size: 2\nstride: 2\npad: 0" [label=""];
"pool1\n(Pooling AVE)\nkernel size: 2\nstride: 2\npad: 0" -> pool1 [label=""];
pool1 -> "ip1\n(InnerProduct)" [label=""];
"ip1\n(InnerProduct)" -> ip1 [label=10];
ip1 -> "prob\n(Softmax)" [label=""];
"prob\n(Softmax)" -> prob [label=""];
}
"""


def net_of(text):
    return parse_text(text, caffe_pb2.NetParameter)


def layer_of(text):
    return parse_text(text, caffe_pb2.LayerParameter)


def canonical(dot_text):
    """DOT text with each statement's attributes sorted (pydot < 4 writes them sorted,
    pydot 4 in the order given) and one space before them (pydot 2 writes two after an
    edge); the statements themselves and their order must match."""
    def sort_attrs(m):
        return "%s [%s];" % (m.group(1), ", ".join(sorted(m.group(2).split(", "))))
    return [re.sub(r"^(.*?) +\[(.*)\];$", sort_attrs, line) for line in dot_text.splitlines()]


def nodes_by_name(graph):
    return {n.get_name(): n for n in graph.get_nodes()}


def out_edges(graph, source):
    return [(e.get_destination(), e.get("label")) for e in graph.get_edges()
            if e.get_source() == source]


# ---- upstream's case: every net of the tree draws -------------------------------------------

NETS = sorted(p for p in glob.glob(os.path.join(REPO, "prototxt", "*", "*.prototxt"))
              if "solver" not in os.path.basename(p))


@pytest.mark.parametrize("path", NETS, ids=lambda p: os.path.relpath(p, REPO))
def test_draw_every_prototxt_net(path):
    net = read_net_param(path)
    graph = draw.get_pydot_graph(net, "LR")
    # one node per (name, type) of layer and per blob; one edge per bottom and per top
    layer_keys = {(l.name, l.type) for l in net.layer}
    blobs = {b for l in net.layer for b in list(l.bottom) + list(l.top)}
    assert len(graph.get_nodes()) == len(layer_keys) + len(blobs)
    assert len(graph.get_edges()) == sum(len(l.bottom) + len(l.top) for l in net.layer)
    text = draw.draw_net(net, "LR", ext="raw").decode()
    # pydot quotes a name that is not a DOT identifier ("ResNet-50")
    assert re.match(r'digraph "?%s"? {\n' % re.escape(net.name), text)
    assert text.rstrip().endswith("}")


def test_dot_text_round_trips_through_pydot_parser():
    text = draw.draw_net(read_net_param(DIGITS), "LR", ext="dot").decode()
    (parsed,) = pydot.graph_from_dot_data(text)
    names = {n.get_name() for n in parsed.get_nodes()}
    assert r'"conv1\n(Convolution)\nkernel size: 3\nstride: 1\npad: 1"' in names
    assert len(parsed.get_edges()) == text.count(" -> ")


# ---- the DOT text of a small net, statement for statement -----------------------------------

def test_dot_text_of_tiny_net_is_upstreams():
    text = draw.draw_net(net_of(TINY), "LR", ext="dot").decode()
    assert canonical(text) == canonical(TINY_DOT_LR)


def test_dot_text_vertical_uses_spaces_and_rankdir():
    text = draw.get_pydot_graph(net_of(TINY), "TB").to_string()
    assert "rankdir=TB;" in text
    assert '"conv1 (Convolution) kernel size: 3 stride: 2 pad: 1" [' in text
    assert '"pool1 (Pooling AVE) kernel size: 2 stride: 2 pad: 0" [' in text
    assert r"\n" not in text


def test_unnamed_net_is_called_Net():
    net = net_of(TINY)
    net.ClearField("name")
    assert draw.get_pydot_graph(net, "LR").to_string().startswith("digraph Net {")


# ---- labels --------------------------------------------------------------------------------

def test_pooling_types_dict():
    assert draw.get_pooling_types_dict() == {0: "MAX", 1: "AVE", 2: "STOCHASTIC"}


@pytest.mark.parametrize("text, rankdir, label", [
    ('name: "c" type: "Convolution" convolution_param { num_output: 8 kernel_size: 5 '
     'stride: 2 pad: 3 }', "LR", r'"c\n(Convolution)\nkernel size: 5\nstride: 2\npad: 3"'),
    # repeated fields absent: Caffe's defaults 1, 1, 0 (kernel_h/kernel_w are not shown)
    ('name: "c" type: "Convolution" convolution_param { num_output: 8 kernel_h: 3 '
     'kernel_w: 1 }', "LR", r'"c\n(Convolution)\nkernel size: 1\nstride: 1\npad: 0"'),
    ('name: "d" type: "Deconvolution" convolution_param { num_output: 8 kernel_size: 4 '
     'stride: 2 }', "BT", '"d (Deconvolution) kernel size: 4 stride: 2 pad: 0"'),
    ('name: "p" type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }', "RL",
     r'"p\n(Pooling MAX)\nkernel size: 3\nstride: 2\npad: 0"'),
    ('name: "p" type: "Pooling" pooling_param { pool: STOCHASTIC kernel_size: 2 pad: 1 }',
     "TB", '"p (Pooling STOCHASTIC) kernel size: 2 stride: 1 pad: 1"'),
    ('name: "fc" type: "InnerProduct" inner_product_param { num_output: 3 }', "LR",
     r'"fc\n(InnerProduct)"'),
    ('name: "r" type: "ReLU"', "TB", '"r (ReLU)"'),
])
def test_layer_label(text, rankdir, label):
    assert draw.get_layer_label(layer_of(text), rankdir) == label


def test_layer_label_learning_rate_multipliers():
    conv = layer_of('name: "c" type: "Convolution" param { lr_mult: 1 } param { lr_mult: 2 } '
                    'convolution_param { num_output: 8 kernel_size: 3 }')
    assert draw.get_layer_label(conv, "TB", display_lrm=True) == \
        '"c (Convolution) kernel size: 3 stride: 1 pad: 0 lr mult: 1.0, 2.0"'
    assert "lr mult" not in draw.get_layer_label(conv, "TB")
    ip = layer_of('name: "f" type: "InnerProduct" param { lr_mult: 0.5 }')
    assert draw.get_layer_lr_mult(ip) == (0.5, 1.0)
    assert draw.get_layer_label(ip, "LR", display_lrm=True) == r'"f\n(InnerProduct)\nlr mult: 0.5, 1.0"'
    plain = layer_of('name: "f" type: "InnerProduct"')
    assert draw.get_layer_lr_mult(plain) == (1.0, 1.0)
    frozen = layer_of('name: "f" type: "InnerProduct" param { lr_mult: 0 } param { lr_mult: 0 }')
    assert draw.get_layer_label(frozen, "LR", display_lrm=True) == r'"f\n(InnerProduct)"'
    relu = layer_of('name: "r" type: "ReLU" param { lr_mult: 3 }')
    assert draw.get_layer_label(relu, "LR", display_lrm=True) == r'"r\n(ReLU)"'
    with pytest.raises(ValueError, match="ReLU layers do not have"):
        draw.get_layer_lr_mult(relu)
    three = layer_of('name: "f" type: "InnerProduct" param {} param {} param {}')
    with pytest.raises(ValueError, match="Could not parse"):
        draw.get_layer_lr_mult(three)


@pytest.mark.parametrize("text, label", [
    ('type: "Data" data_param { batch_size: 64 }', "Batch 64"),
    ('type: "Convolution" convolution_param { num_output: 96 }', "96"),
    ('type: "Deconvolution" convolution_param { num_output: 21 }', "21"),
    ('type: "InnerProduct" inner_product_param { num_output: 1000 }', "1000"),
    ('type: "Input"', '""'),
    ('type: "Pooling"', '""'),
])
def test_edge_label(text, label):
    assert draw.get_edge_label(layer_of(text)) == label


def test_edges_carry_blob_names_and_labels():
    graph = draw.get_pydot_graph(net_of(TINY), "LR")
    conv = r'"conv1\n(Convolution)\nkernel size: 3\nstride: 2\npad: 1"'
    assert out_edges(graph, "data") == [(conv, '""')]
    assert out_edges(graph, conv) == [("conv1", "4")]
    assert out_edges(graph, r'"ip1\n(InnerProduct)"') == [("ip1", "10")]
    unlabelled = draw.get_pydot_graph(net_of(TINY), "LR", label_edges=False)
    assert {e.get("label") for e in unlabelled.get_edges()} == {'""'}


# ---- colours and styles -------------------------------------------------------------------

def test_choose_color_by_layertype():
    assert draw.choose_color_by_layertype("Convolution") == "#FF5050"
    assert draw.choose_color_by_layertype("Deconvolution") == "#FF5050"
    assert draw.choose_color_by_layertype("Pooling") == "#FF9900"
    assert draw.choose_color_by_layertype("InnerProduct") == "#CC33FF"
    assert draw.choose_color_by_layertype("Eltwise") == "#6495ED"


def test_node_colours_and_styles():
    net = net_of(TINY + """
layer { name: "relu2" type: "ReLU" bottom: "prob" top: "relu2" }
layer { name: "up" type: "Deconvolution" bottom: "relu2" top: "up"
        convolution_param { num_output: 2 kernel_size: 2 } }
""")
    nodes = nodes_by_name(draw.get_pydot_graph(net, "LR"))
    fill = {name: node.get("fillcolor") for name, node in nodes.items()}
    assert fill[r'"relu1\n(ReLU)"'] == '#90EE90'      # in place: a neuron layer
    assert fill[r'"relu2\n(ReLU)"'] == '#6495ED'      # not in place: default colour
    assert fill[r'"up\n(Deconvolution)\nkernel size: 2\nstride: 1\npad: 0"'] == '#FF5050'
    assert fill[r'"ip1\n(InnerProduct)"'] == '#CC33FF'
    assert all(nodes[n].get("shape") == "record" for n in nodes if n.startswith('"'))
    # a blob some layer reads is a grey octagon; one only written (up) has no style
    assert nodes["prob"].get("shape") == "octagon" and fill["prob"] == '#E0E0E0'
    assert nodes["up"].get_attributes() == {}
    # the module's styles are not changed by drawing (upstream mutated its default)
    assert draw.LAYER_STYLE_DEFAULT["fillcolor"] == "#6495ED"


# ---- phase ----------------------------------------------------------------------------------

def test_phase_filter_on_digits():
    net = read_net_param(DIGITS)
    data = r'"data\n(Data)"'
    every = draw.get_pydot_graph(net, "LR")
    # the TRAIN and TEST data layers share name and type: one node, both sets of edges
    assert sorted(out_edges(every, data)) == sorted(
        [("data", "Batch 64"), ("label", "Batch 64"),
         ("data", "Batch 120"), ("label", "Batch 120")])
    train = draw.get_pydot_graph(net, "LR", phase=TRAIN)
    assert out_edges(train, data) == [("data", "Batch 64"), ("label", "Batch 64")]
    assert r'"accuracy\n(Accuracy)"' not in nodes_by_name(train)
    test = draw.get_pydot_graph(net, "LR", phase=TEST)
    assert out_edges(test, data) == [("data", "Batch 120"), ("label", "Batch 120")]
    assert r'"accuracy\n(Accuracy)"' in nodes_by_name(test)
    # pycaffe's draw_net.py passes caffe.TRAIN; its name is accepted too
    assert draw.get_pydot_graph(net, "LR", phase="TRAIN").to_string() == train.to_string()


def test_phase_filter_exclude_and_errors():
    net = net_of(TINY + """
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" exclude { phase: TEST } }
""")
    assert r'"drop\n(Dropout)"' in nodes_by_name(draw.get_pydot_graph(net, "LR", phase=TRAIN))
    assert r'"drop\n(Dropout)"' not in nodes_by_name(draw.get_pydot_graph(net, "LR", phase=TEST))
    both = net_of(TINY + 'layer { name: "bad" type: "ReLU" bottom: "ip1" top: "ip1" '
                         'include { phase: TRAIN } exclude { phase: TEST } }')
    with pytest.raises(ValueError, match="layer bad has both include and exclude"):
        draw.get_pydot_graph(both, "LR", phase=TRAIN)
    draw.get_pydot_graph(both, "LR")  # no phase: no filter, no error (as upstream)
    with pytest.raises(ValueError, match="unknown phase 'VAL'"):
        draw.get_pydot_graph(net, "LR", phase="VAL")
    with pytest.raises(ValueError, match="unknown phase 7"):
        draw.get_pydot_graph(net, "LR", phase=7)


# ---- files and formats ----------------------------------------------------------------------

@pytest.mark.parametrize("ext", ["dot", "raw"])
def test_draw_net_to_file_dot_text_without_graphviz(tmp_path, monkeypatch, ext):
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)  # as if dot were missing
    out = tmp_path / ("net." + ext)
    draw.draw_net_to_file(net_of(TINY), str(out))  # rankdir defaults to LR, as upstream
    assert canonical(out.read_text()) == canonical(TINY_DOT_LR)


def test_image_without_graphviz_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    out = tmp_path / "net.png"
    with pytest.raises(FileNotFoundError, match=r"Graphviz's `dot`.*\.dot or \.raw"):
        draw.draw_net_to_file(net_of(TINY), out)
    assert not out.exists()
    with pytest.raises(ValueError, match="has none"):
        draw.draw_net_to_file(net_of(TINY), tmp_path / "net")


@needs_dot
def test_draw_net_renders_png_and_svg(tmp_path):
    png = draw.draw_net(net_of(TINY), "LR")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    draw.draw_net_to_file(net_of(TINY), tmp_path / "net.svg", "TB", phase=TEST)
    svg = (tmp_path / "net.svg").read_text()
    assert "<svg" in svg and "<title>tiny</title>" in svg
    with pytest.raises(RuntimeError, match="'nosuchformat'"):
        draw.draw_net(net_of(TINY), "LR", ext="nosuchformat")


def test_missing_pydot_names_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydot", None)  # import pydot now raises ImportError
    with pytest.raises(ImportError, match="pip install pydot"):
        draw.get_pydot_graph(net_of(TINY), "LR")


# ---- the script (pycaffe's python/draw_net.py) ---------------------------------------------

def test_draw_net_script_phase_and_rankdir(tmp_path, capsys):
    out = tmp_path / "digits.dot"
    assert draw_net_main([DIGITS, str(out), "--rankdir", "TB", "--phase", "TEST"]) == 0
    assert capsys.readouterr().out == "Drawing net to %s\n" % out
    expected = draw.get_pydot_graph(read_net_param(DIGITS), "TB", phase=TEST).to_string()
    assert out.read_text() == expected
    assert '"Batch 120"' in expected and '"Batch 64"' not in expected


def test_draw_net_script_display_lrm_and_errors(tmp_path, capsys):
    out = tmp_path / "digits.raw"
    assert draw_net_main([DIGITS, str(out), "--display_lrm"]) == 0
    assert r"\nlr mult: 1.0, 2.0" in out.read_text()
    assert draw_net_main([str(tmp_path / "missing.prototxt"), str(out)]) == 1
    assert "missing.prototxt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        draw_net_main([DIGITS, str(out), "--phase", "VAL"])


def test_minicaffe_draw_command(tmp_path):
    from minicaffe.cli import main
    out = tmp_path / "net.dot"
    assert main(["draw", DIGITS, str(out), "--phase", "TRAIN"]) == 0
    assert out.read_text() == draw.get_pydot_graph(read_net_param(DIGITS), "LR",
                                                   phase=TRAIN).to_string()
