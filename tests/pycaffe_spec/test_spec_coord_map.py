"""pycaffe's own coordinate-map tests, as a spec: BVLC Caffe
python/caffe/test/test_coord_map.py (conv/pool/deconv maps, pass-through layers, padding,
several bottoms, anisotropic and N-D convolution, Crop, the crop() helper and its errors),
written for pytest and run through ``from caffe.coord_map import ...``.

Upstream draws its padding and offset with random.randint(0, 10); here each value of
that range is a case.
"""
import numpy as np
import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe
from caffe import layers as L
from caffe import params as P
from caffe.coord_map import coord_map_from_to, crop


def coord_net_spec(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    """data (2, 1, 100, 100) -> conv -> max pool -> deconv (kernel twice its stride), and
    an aux input (2, 1, 20, 20)."""
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 1, 100, 100]))
    n.aux = L.Input(shape=dict(dim=[2, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool, pad=0)
    if isinstance(dstride, (list, tuple)):
        deconv_ks = [s * 2 for s in dstride]
    else:
        deconv_ks = dstride * 2
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=deconv_ks, stride=dstride,
                               pad=dpad)
    return n


def test_conv_pool_deconv():
    n = coord_net_spec()
    # 2x pool then 2x deconv: the identity
    assert coord_map_from_to(n.deconv, n.data) == (1, 1, 0)
    # 4x pool then 4x deconv: a shift by one
    n = coord_net_spec(pool=4, dstride=4)
    assert coord_map_from_to(n.deconv, n.data) == (1, 1, -1)


def test_pass():
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.relu = L.ReLU(n.deconv)
    n.conv1x1 = L.Convolution(n.relu, num_output=10, kernel_size=1, stride=1, pad=0)
    for top in [n.relu, n.conv1x1]:
        assert coord_map_from_to(top, n.data) == (ax, a, b)


@pytest.mark.parametrize("pad", range(0, 11))
def test_padding(pad):
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    # conv padding adds an offset
    n = coord_net_spec(pad=pad)
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b - pad == b_pad
    # deconv padding subtracts it
    n = coord_net_spec(dpad=pad)
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b + pad == b_pad
    # both cancel out
    n = coord_net_spec(pad=pad, dpad=pad)
    _, a_pad, b_pad = coord_map_from_to(n.deconv, n.data)
    assert a == a_pad and b == b_pad


def test_multi_conv():
    n = coord_net_spec()
    n.conv_data, n.conv_aux = L.Convolution(n.data, n.aux, ntop=2, num_output=10,
                                            kernel_size=5, stride=2, pad=0)
    ax1, a1, b1 = coord_map_from_to(n.conv_data, n.data)
    ax2, a2, b2 = coord_map_from_to(n.conv_aux, n.aux)
    assert (ax1, a1, b1) == (ax2, a2, b2)
    assert (ax1, a1, b1) == (1, 2, 2)  # stride 2, kernel 5: input 2i + 2 for output i


def test_rect():
    n3x3 = coord_net_spec(ks=3, stride=1, pad=0)
    n5x5 = coord_net_spec(ks=5, stride=2, pad=10)
    n3x5 = coord_net_spec(ks=[3, 5], stride=[1, 2], pad=[0, 10])
    ax_3x3, a_3x3, b_3x3 = coord_map_from_to(n3x3.deconv, n3x3.data)
    ax_5x5, a_5x5, b_5x5 = coord_map_from_to(n5x5.deconv, n5x5.data)
    ax_3x5, a_3x5, b_3x5 = coord_map_from_to(n3x5.deconv, n3x5.data)
    assert ax_3x3 == ax_5x5 == ax_3x5
    assert a_3x3 == a_3x5[0] and b_3x3 == b_3x5[0]
    assert a_5x5 == a_3x5[1] and b_5x5 == b_3x5[1]


def test_nd_conv():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3, 100, 100, 100]))
    n.conv = L.Convolution(n.data, num_output=10, kernel_size=[3, 3, 3], stride=[1, 1, 1],
                           pad=[0, 1, 2])
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=2, stride=2, pad=0)
    n.deconv = L.Deconvolution(n.pool, num_output=10, kernel_size=4, stride=2, pad=0)
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    assert ax == 1
    assert len(a) == len(b) == 3
    assert np.all(a == 1)
    assert b[0] - 1 == b[1]
    assert b[1] - 1 == b[2]


@pytest.mark.parametrize("offset", range(0, 11))
def test_crop_of_crop(offset):
    n = coord_net_spec()
    ax, a, b = coord_map_from_to(n.deconv, n.data)
    n.crop = L.Crop(n.deconv, n.data, axis=2, offset=offset)
    ax_crop, a_crop, b_crop = coord_map_from_to(n.crop, n.data)
    assert ax == ax_crop and a == a_crop
    assert b + offset == b_crop


def test_crop_helper(tmp_path):
    n = coord_net_spec()
    n.crop = crop(n.deconv, n.data)
    # the layer it defines: crop from axis 2 at the mapped offset (0 for this net)
    proto = n.to_proto()
    layer = proto.layer[-1]
    assert layer.type == 'Crop' and list(layer.bottom) == ['deconv', 'data']
    assert layer.crop_param.axis == 2 and list(layer.crop_param.offset) == [0]
    path = tmp_path / "crop.prototxt"
    path.write_text(str(proto))
    net = caffe.Net(str(path), caffe.TEST)
    assert net.blobs['crop'].data.shape == (2, 10, 100, 100)
    # a 4x net is shifted by one: crop() asks for offset 1
    n = coord_net_spec(pool=4, dstride=4)
    n.crop = crop(n.deconv, n.data)
    assert list(n.to_proto().layer[-1].crop_param.offset) == [1]


def test_catch_unconnected():
    n = coord_net_spec()
    n.ip = L.InnerProduct(n.deconv, num_output=10)
    with pytest.raises(RuntimeError):
        coord_map_from_to(n.ip, n.data)


def test_catch_scale_mismatch():
    n = coord_net_spec(pool=3, dstride=2)  # 3x pool, 2x deconv
    with pytest.raises(AssertionError):
        crop(n.deconv, n.data)


def test_catch_negative_crop():
    n = coord_net_spec(dpad=10)  # the output is smaller than the input
    with pytest.raises(AssertionError):
        crop(n.deconv, n.data)
