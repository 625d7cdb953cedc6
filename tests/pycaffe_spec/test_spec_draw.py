"""pycaffe's own drawing test, as a spec: BVLC Caffe python/caffe/test/test_draw.py, written
for pytest and run through ``import caffe.draw``.

Upstream merges every net prototxt under models/ and examples/ (solvers left out) and draws
it with ``caffe.draw.draw_net(net, 'LR')``, a PNG through Graphviz.  Here the nets are those
under prototxt/.  Every one is drawn as DOT text (the whole graph construction, no Graphviz
needed); the small ones are also rendered to PNG where ``dot`` is installed (the ResNets and
GoogLeNet take seconds each in ``dot``).
"""
import os
import shutil

import pytest
from google.protobuf import text_format

pytest.importorskip("pydot")

import minicaffe  # noqa: E402,F401  (makes ``import caffe`` reach minicaffe)
import caffe.draw  # noqa: E402
from caffe.proto import caffe_pb2  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SMALL = ("digits", "cifar10_quick", "alexnet")


def get_filenames():
    """The net prototxts of the source tree (solvers left out), as upstream's getFilenames."""
    dirname = os.path.join(ROOT, "prototxt")
    assert os.path.exists(dirname)
    for cwd, _, filenames in sorted(os.walk(dirname)):
        for filename in sorted(filenames):
            if filename.endswith(".prototxt") and "solver" not in filename:
                yield os.path.join(cwd, filename)


def test_caffe_draw_is_minicaffe_draw():
    assert caffe.draw is minicaffe.draw


def test_draw_net():
    filenames = list(get_filenames())
    assert len(filenames) >= 18
    for filename in filenames:
        net = caffe_pb2.NetParameter()
        with open(filename) as infile:
            text_format.Merge(infile.read(), net)
        dot = caffe.draw.draw_net(net, "LR", ext="raw")
        assert dot.count(b" -> ") == sum(len(l.bottom) + len(l.top) for l in net.layer)
        if shutil.which("dot") and os.path.basename(os.path.dirname(filename)) in SMALL:
            assert caffe.draw.draw_net(net, "LR").startswith(b"\x89PNG")
