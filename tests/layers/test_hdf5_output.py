"""HDF5Output: the two bottoms written as datasets "data" and "label", as BVLC Caffe's
HDF5OutputLayer writes them (hdf5_output_layer.cpp, hdf5_save_nd_dataset): the file
truncated at setup, float or double datasets after the net's Dtype, legacy 4-axis
shapes, one forward per file."""
import numpy as np
import pytest

from minicaffe.blob import Blob
from minicaffe.net import Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing import make_layer
from minicaffe.transform import TEST

h5py = pytest.importorskip("h5py")

NET = """
name: "dump"
layer {{ name: "in" type: "Input" top: "data" top: "label"
  input_param {{ shape {{ dim: 2 dim: 3 dim: 4 dim: 5 }} shape {{ dim: 2 }} }} }}
layer {{ name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
  hdf5_output_param {{ file_name: "{path}" }} }}
"""


def build(path, dtype=np.float32, mode=None):
    return Net(parse_text(NET.format(path=path), caffe_pb2.NetParameter), TEST, dtype=dtype,
               mode=mode)


def fill(net, rng):
    data = rng.standard_normal((2, 3, 4, 5))
    label = np.array([3.0, 7.0])
    net.blobs["data"].data[...] = net.xp.asarray(data)
    net.blobs["label"].data[...] = net.xp.asarray(label)
    return data, label


def out_layer(net):
    return net.layers[net.layer_index("out")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_net_writes_its_bottoms_as_data_and_label(tmp_path, rng, dtype):
    path = tmp_path / "out.h5"
    net = build(path, dtype)
    data, label = fill(net, rng)
    net.forward()
    out_layer(net).close()
    with h5py.File(path, "r") as f:
        assert sorted(f.keys()) == ["data", "label"]
        # H5LTmake_dataset_float / _double: the net's Dtype
        assert f["data"].dtype == np.dtype(dtype) and f["label"].dtype == np.dtype(dtype)
        assert f["data"].shape == (2, 3, 4, 5)
        # the label blob is copied into a legacy (num, channels, height, width) blob
        assert f["label"].shape == (2, 1, 1, 1)
        np.testing.assert_array_equal(f["data"][...], data.astype(dtype))
        np.testing.assert_array_equal(f["label"][...].ravel(), label)


def test_setup_truncates_the_file(tmp_path):
    path = tmp_path / "out.h5"
    with h5py.File(path, "w") as f:
        f["old"] = np.arange(4.0)
    net = build(path)
    out_layer(net).close()  # no forward: H5F_ACC_TRUNC has already emptied it
    with h5py.File(path, "r") as f:
        assert list(f.keys()) == []


def test_a_second_forward_fails_as_in_caffe_and_keeps_the_first_batch(tmp_path, rng):
    path = tmp_path / "out.h5"
    net = build(path)
    data, _ = fill(net, rng)
    net.forward()
    fill(net, rng)
    with pytest.raises(RuntimeError, match=r"layer 'out' \(HDF5Output\): failed to make dataset "
                                           r"'data' in .*out\.h5.*once per file"):
        net.forward()
    out_layer(net).close()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][...], data.astype(np.float32))
    with pytest.raises(RuntimeError, match="was closed"):
        net.forward()


def setup_layer(path, shapes, dtype=np.float32):
    layer = make_layer(f'name: "out" type: "HDF5Output" bottom: "a" bottom: "b" '
                       f'hdf5_output_param {{ file_name: "{path}" }}', dtype=dtype)
    bottom = [Blob(s, dtype=dtype, name=n) for s, n in zip(shapes, ("a", "b"))]
    layer.setup(bottom, [])
    return layer, bottom


def test_shapes_errors_and_declarations(tmp_path):
    # fewer axes are padded with 1 (LegacyShape), a scalar-like row of 1 too
    layer, bottom = setup_layer(tmp_path / "a.h5", [(3, 2), (3, 4, 1)])
    bottom[0].data[...] = np.arange(6).reshape(3, 2)
    layer.forward(bottom, [])
    layer.close()
    with h5py.File(tmp_path / "a.h5", "r") as f:
        assert f["data"].shape == (3, 2, 1, 1) and f["label"].shape == (3, 4, 1, 1)

    layer, bottom = setup_layer(tmp_path / "b.h5", [(3, 2), (2,)])
    with pytest.raises(ValueError, match=r"\(HDF5Output\): data blob and label blob must have "
                                         r"the same batch size: 'a' has 3, 'b' has 2"):
        layer.forward(bottom, [])
    layer.close()
    layer, bottom = setup_layer(tmp_path / "c.h5", [(1, 2, 3, 4, 5), (1,)])
    with pytest.raises(ValueError, match=r"bottom 0 'a' has shape \(1, 2, 3, 4, 5\).*at most 4"):
        layer.forward(bottom, [])
    layer.close()

    with pytest.raises(ValueError, match="exactly 2 bottom"):
        make_layer('name: "o" type: "HDF5Output" hdf5_output_param { file_name: "x.h5" }'
                   ).setup([Blob((1,))], [])
    with pytest.raises(ValueError, match="exactly 0 top"):
        make_layer(f'name: "o" type: "HDF5Output" hdf5_output_param {{ file_name: '
                   f'"{tmp_path / "d.h5"}" }}').setup([Blob((1,)), Blob((1,))], [Blob((1,))])
    with pytest.raises(ValueError, match=r"'o' \(HDF5Output\): hdf5_output_param.file_name is "
                                         "not set"):
        make_layer('name: "o" type: "HDF5Output"').setup([Blob((1,)), Blob((1,))], [])
    with pytest.raises(OSError, match=r"'o' \(HDF5Output\): failed to open HDF5 file "
                                      r"'.*nodir/x\.h5'"):
        make_layer(f'name: "o" type: "HDF5Output" hdf5_output_param {{ file_name: '
                   f'"{tmp_path / "nodir" / "x.h5"}" }}').setup([Blob((1,)), Blob((1,))], [])

    # backward does nothing: the bottom diffs are left as they are
    layer, bottom = setup_layer(tmp_path / "e.h5", [(2, 3), (2,)])
    bottom[0].diff[...] = 5.0
    layer.backward([], [True, True], bottom)
    assert np.all(bottom[0].diff == 5.0)
    assert layer.backward_reads().bottom == () and layer.flops(bottom, []) == (0.0, 0.0)
    layer.close()


@pytest.mark.gpu
def test_gpu_bottoms_are_copied_to_the_host(cp, tmp_path, rng):
    path = tmp_path / "gpu.h5"
    net = build(path, mode="GPU")
    assert net.xp is cp
    data, label = fill(net, rng)
    net.forward()
    out_layer(net).close()
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][...], data.astype(np.float32))
        np.testing.assert_array_equal(f["label"][...].ravel(), label)
