"""upgrade_net_proto_text, upgrade_net_proto_binary, upgrade_solver_proto_text: what they
write reads back (as written, without upgrading) equal to what minicaffe's readers give for
the old file; their logs and exit statuses are Caffe's tools'."""
import os
import subprocess
import sys

import numpy as np
import pytest

from minicaffe.net import TEST, Net
from minicaffe.proto import (caffe_pb2, net_needs_upgrade, read_binary, read_net_param,
                             read_solver_param, upgrade_net, write_binary)
from minicaffe.tools import upgrade_net_proto_binary, upgrade_net_proto_text
from minicaffe.tools import upgrade_solver_proto_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

V0_NET = """name: "v0"
input: "data"
input_dim: 2 input_dim: 1 input_dim: 6 input_dim: 6
layers { layer { name: "pad1" type: "padding" pad: 1 } bottom: "data" top: "pad1" }
layers { layer { name: "conv1" type: "conv" num_output: 2 kernelsize: 3
                 weight_filler { type: "gaussian" std: 0.1 } blobs_lr: 1 blobs_lr: 2 }
         bottom: "pad1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: MAX kernelsize: 2 stride: 2 }
         bottom: "conv1" top: "pool1" }
layers { layer { name: "ip1" type: "innerproduct" num_output: 3 } bottom: "pool1" top: "ip1" }
layers { layer { name: "relu1" type: "relu" } bottom: "ip1" top: "ip1" }
"""

V1_NET = """name: "v1"
input: "data"
input_dim: 2 input_dim: 1 input_dim: 5 input_dim: 5
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv"
         blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
         convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "xavier" } } }
layers { name: "relu" type: RELU bottom: "conv" top: "conv" }
layers { name: "ip" type: INNER_PRODUCT bottom: "conv" top: "ip"
         inner_product_param { num_output: 4 } }
layers { name: "prob" type: SOFTMAX bottom: "ip" top: "prob" include { phase: TEST } }
"""

CURRENT_NET = """name: "current"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 2 } }
"""


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, what", [(V1_NET, "V1LayerParameter"),
                                        (V0_NET, "V0LayerParameter")])
def test_old_net_is_written_as_minicaffe_reads_it(tmp_path, capsys, text, what):
    old = write(tmp_path / "old.prototxt", text)
    new = str(tmp_path / "new.prototxt")
    assert upgrade_net_proto_text.main([old, new]) == 0
    err = capsys.readouterr().err
    assert f"Attempting to upgrade input file specified using deprecated {what}: {old}" in err
    assert "Attempting to upgrade input file specified using deprecated input fields" in err
    assert f"Wrote upgraded NetParameter text proto to {new}" in err
    written = read_net_param(new, upgrade=False)      # as written: nothing left to upgrade
    assert not net_needs_upgrade(written)
    assert written == read_net_param(old)
    assert "layers {" not in open(new).read() and "input_dim" not in open(new).read()
    assert written.layer[0].type == "Input"
    # both build the same net: the same layers, blobs and parameter shapes
    a, b = Net(old, TEST), Net(new, TEST)
    assert a.layer_names == b.layer_names
    assert {n: x.shape for n, x in a.blobs.items()} == {n: x.shape for n, x in b.blobs.items()}


def test_v0_net_folds_padding_and_moves_flat_fields(tmp_path):
    new = str(tmp_path / "new.prototxt")
    assert upgrade_net_proto_text.main([write(tmp_path / "old.prototxt", V0_NET), new]) == 0
    net = read_net_param(new, upgrade=False)
    conv = next(layer for layer in net.layer if layer.name == "conv1")
    assert [layer.name for layer in net.layer] == ["input", "conv1", "pool1", "ip1", "relu1"]
    assert conv.type == "Convolution" and list(conv.bottom) == ["data"]
    assert list(conv.convolution_param.pad) == [1]
    assert list(conv.convolution_param.kernel_size) == [3]
    assert [p.lr_mult for p in conv.param] == [1, 2]


def test_current_net_is_written_back_with_a_note(tmp_path, capsys):
    old = write(tmp_path / "old.prototxt", CURRENT_NET)
    new = str(tmp_path / "new.prototxt")
    assert upgrade_net_proto_text.main([old, new]) == 0
    assert f"File already in latest proto format: {old}" in capsys.readouterr().err
    assert read_net_param(new, upgrade=False) == read_net_param(old, upgrade=False)


def test_v0_field_of_another_type_is_dropped_written_and_the_status_is_1(tmp_path, capsys):
    # Caffe's UpgradeV0LayerParameter logs "Unknown parameter num_output for layer type relu",
    # goes on, and the tool writes the net and returns 1
    old = write(tmp_path / "old.prototxt", V0_NET.replace(
        'type: "relu" }', 'type: "relu" num_output: 7 }'))
    new = str(tmp_path / "new.prototxt")
    assert upgrade_net_proto_text.main([old, new]) == 1
    err = capsys.readouterr().err
    assert ('layers 3 ("relu1"): V0 field num_output does not apply to a \'relu\' layer; '
            "dropped") in err
    assert "upgrade_net_proto_text] upgrading a net in the deprecated V0 format" in err
    assert "Encountered error(s) while upgrading prototxt; see details above." in err
    assert read_net_param(new, upgrade=False) == read_net_param(old)


def test_net_that_cannot_be_upgraded_fails_and_writes_nothing(tmp_path, capsys):
    mixed = V1_NET + 'layer { name: "x" type: "ReLU" bottom: "ip" top: "x" }\n'
    new = tmp_path / "new.prototxt"
    assert upgrade_net_proto_text.main([write(tmp_path / "old.prototxt", mixed),
                                        str(new)]) == 1
    err = capsys.readouterr().err
    assert "specifies both V1 'layers' (4) and new-style 'layer' (1)" in err
    assert "Encountered error(s) while upgrading prototxt" in err and not new.exists()


def test_unparsable_input_is_status_2(tmp_path, capsys):
    bad = write(tmp_path / "bad.prototxt", "layer { name: \n")
    assert upgrade_net_proto_text.main([bad, str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"Failed to parse input text file as NetParameter: {bad}" in err
    assert "bad.prototxt:2" in err                  # the parser's line
    assert upgrade_net_proto_text.main([str(tmp_path / "missing"), str(tmp_path / "o")]) == 2
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def v1_caffemodel(rng):
    """A V1 binary model, as Caffe wrote them before 2015: ``layers`` with their blobs."""
    net = caffe_pb2.NetParameter(name="old_model")
    conv = net.layers.add(name="conv", type=caffe_pb2.V1LayerParameter.CONVOLUTION,
                          bottom=["data"], top=["conv"], blobs_lr=[1, 2])
    conv.convolution_param.num_output = 2
    conv.convolution_param.kernel_size.append(3)
    for shape in ((2, 1, 3, 3), (2,)):
        blob = conv.blobs.add()
        blob.shape.dim.extend(shape)
        blob.data.extend(rng.normal(size=shape).astype(np.float32).ravel().tolist())
    net.layers.add(name="relu", type=caffe_pb2.V1LayerParameter.RELU, bottom=["conv"],
                   top=["conv"])
    return net


def test_binary_v1_model_round_trip(tmp_path, capsys, rng):
    old, new, again = (str(tmp_path / n) for n in ("old.caffemodel", "new.caffemodel",
                                                     "again.caffemodel"))
    model = v1_caffemodel(rng)
    write_binary(model, old)
    assert upgrade_net_proto_binary.main([old, new]) == 0
    err = capsys.readouterr().err
    assert "deprecated V1LayerParameter" in err
    assert f"Wrote upgraded NetParameter binary proto to {new}" in err
    upgraded = read_binary(new, caffe_pb2.NetParameter)
    assert upgraded == upgrade_net(model) and not upgraded.layers
    assert [(layer.name, layer.type) for layer in upgraded.layer] == [
        ("conv", "Convolution"), ("relu", "ReLU")]
    # the weights load into a current net by layer name
    net = Net(write(tmp_path / "net.prototxt", """
        layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 1
                dim: 4 dim: 4 } } }
        layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
                convolution_param { num_output: 2 kernel_size: 3 } }"""), TEST, weights=new)
    np.testing.assert_array_equal(net.params["conv"][1].data, np.asarray(model.layers[0].blobs[1]
                                                                         .data, np.float32))
    # a second pass has nothing to do: the same bytes come back
    assert upgrade_net_proto_binary.main([new, again]) == 0
    assert f"File already in latest proto format: {new}" in capsys.readouterr().err
    assert open(again, "rb").read() == open(new, "rb").read()


def test_binary_tool_refuses_a_text_file(tmp_path, capsys):
    text = write(tmp_path / "net.prototxt", V1_NET)
    assert upgrade_net_proto_binary.main([text, str(tmp_path / "out")]) == 2
    assert f"Failed to parse input binary file as NetParameter: {text}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


SOLVER = """net: "train_val.prototxt"
base_lr: 0.01
momentum: 0.9
lr_policy: "step"
stepsize: 100
solver_type: NESTEROV
"""


def test_solver_type_enum_becomes_the_type_string(tmp_path, capsys):
    old = write(tmp_path / "solver.prototxt", SOLVER)
    new = str(tmp_path / "new_solver.prototxt")
    assert upgrade_solver_proto_text.main([old, new]) == 0
    err = capsys.readouterr().err
    assert "deprecated 'solver_type' field (enum)" in err
    assert f"Wrote upgraded SolverParameter text proto to {new}" in err
    written = read_solver_param(new, upgrade=False)
    assert written == read_solver_param(old)
    assert written.type == "Nesterov" and not written.HasField("solver_type")
    assert "solver_type" not in open(new).read()
    # already current: written back as it is, with a note
    assert upgrade_solver_proto_text.main([new, str(tmp_path / "again")]) == 0
    assert f"File already in latest proto format: {new}" in capsys.readouterr().err
    assert read_solver_param(str(tmp_path / "again"), upgrade=False) == written


def test_solver_with_both_type_fields_fails_and_writes_nothing(tmp_path, capsys):
    old = write(tmp_path / "solver.prototxt", SOLVER + 'type: "Adam"\n')
    new = tmp_path / "new"
    assert upgrade_solver_proto_text.main([old, str(new)]) == 1
    err = capsys.readouterr().err
    assert "both the deprecated 'solver_type' (enum) and 'type' (string)" in err
    assert not new.exists()
    assert upgrade_solver_proto_text.main([write(tmp_path / "bad", "base_lr: x\n"),
                                           str(new)]) == 2
    assert "Failed to parse input text file as SolverParameter" in capsys.readouterr().err


def test_modules_run(tmp_path):
    old = write(tmp_path / "solver.prototxt", SOLVER)
    r = subprocess.run([sys.executable, "-m", "minicaffe.tools.upgrade_solver_proto_text", old,
                        str(tmp_path / "new")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert 'type: "Nesterov"' in (tmp_path / "new").read_text()
    r = subprocess.run([sys.executable, "-m", "minicaffe.tools.upgrade_net_proto_text", old],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "OUT" in r.stderr        # usage: IN and OUT


@pytest.mark.parametrize("tool", [upgrade_net_proto_text, upgrade_net_proto_binary,
                                  upgrade_solver_proto_text])
def test_a_wrong_command_line_is_status_1_not_the_unparsable_inputs_2(tool, tmp_path, capsys):
    """Caffe's upgrade tools: argc != 3 prints the usage and returns 1; 2 is kept for an
    input that does not parse (argparse's own usage status was 2)."""
    for argv in ([], [str(tmp_path / "in")], ["a", "b", "c"]):
        assert tool.main(argv) == 1, argv
        assert "usage:" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
