"""pycaffe's ``caffe.coord_map``: the affine map between the spatial coordinates of two
NetSpec tops, and ``crop`` to align one top to another with a Crop layer.

Follows BVLC Caffe's python/caffe/coord_map.py (upstream master).  A map is a triple
``(axis, a, b)``: output coordinate ``a * x + b`` for input coordinate ``x`` on the axes
from ``axis`` on, with ``a`` and ``b`` arrays of one value per spatial axis (or scalars for
the identity ``(None, 1, 0)`` of pointwise layers, which fits any axis).

    n.score = crop(n.upscore, n.data)   # FCN's use: crop the upsampled scores to the input
"""
from __future__ import annotations

import numpy as np

# absolute import: ``import caffe.coord_map`` loads this file a second time under the name
# caffe.coord_map, and its tops must still be minicaffe.netspec's
from minicaffe.netspec import L

# layers whose output coordinates are their input coordinates (upstream's list)
PASS_THROUGH_LAYERS = ['AbsVal', 'BatchNorm', 'Bias', 'BNLL', 'Dropout', 'Eltwise', 'ELU',
                       'Log', 'LRN', 'Exp', 'MVN', 'Power', 'ReLU', 'PReLU', 'Scale',
                       'Sigmoid', 'Split', 'TanH', 'Threshold']


class UndefinedMapException(Exception):
    """The layer has no coordinate map (InnerProduct, a loss ...)."""


class AxisMismatchException(Exception):
    """Two maps act on different first axes and cannot be composed."""


def conv_params(fn):
    """(axis, stride, effective kernel extent, pad) of a Convolution, Deconvolution, Im2col
    or Pooling layer, each an array of one or more values.  Parameters may be given
    directly as keywords or inside ``convolution_param``; the legacy ``_h``/``_w`` fields
    are refused, as upstream does."""
    params = fn.params.get('convolution_param', fn.params)
    legacy = {'pad_h', 'pad_w', 'kernel_h', 'kernel_w', 'stride_h', 'stride_w'}
    assert not legacy & set(fn.params), 'cropping does not support legacy _h/_w params'
    kernel = np.array(params['kernel_size'], ndmin=1)
    dilation = np.array(params.get('dilation', 1), ndmin=1)
    return (params.get('axis', 1),
            np.array(params.get('stride', 1), ndmin=1),
            (kernel - 1) * dilation + 1,
            np.array(params.get('pad', 0), ndmin=1))


def crop_params(fn):
    """(axis, offset) of a Crop layer with CropParameter's defaults (axis 2, offset 0)."""
    params = fn.params.get('crop_param', fn.params)
    return params.get('axis', 2), np.array(params.get('offset', 0), ndmin=1)


def coord_map(fn):
    """The map ``(axis, a, b)`` from a layer's bottom coordinates to its top's."""
    if fn.type_name in ('Convolution', 'Pooling', 'Im2col'):
        axis, stride, extent, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if fn.type_name == 'Deconvolution':
        axis, stride, extent, pad = conv_params(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if fn.type_name in PASS_THROUGH_LAYERS:
        return None, 1, 0
    if fn.type_name == 'Crop':
        axis, offset = crop_params(fn)
        # Crop's axis names the first cropped axis; the maps above name the last axis
        # before the coordinates (Convolution's channel axis 1)
        return axis - 1, 1, -offset
    raise UndefinedMapException


def compose(base_map, next_map):
    """``base`` after ``next``: scales multiply, and next's shift is scaled by base's."""
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is None:
        ax = ax2
    elif ax2 is None or ax1 == ax2:
        ax = ax1
    else:
        raise AxisMismatchException
    return ax, a1 * a2, a1 * b2 + b1


def inverse(coord_map):
    """The map back from output to input coordinates."""
    ax, a, b = coord_map
    return ax, 1 / a, -b / a


def _mappable_bottoms(top):
    # every bottom of a layer shares its map, except Crop's second bottom, which only
    # gives the size to crop to
    bottoms = top.fn.inputs
    return bottoms[:1] if top.fn.type_name == 'Crop' else bottoms


def coord_map_from_to(top_from, top_to):
    """The map from ``top_from``'s coordinates to ``top_to``'s.

    Walks back from ``top_from`` composing maps to every ancestor it can reach, then back
    from ``top_to`` until it meets one of them; raises RuntimeError where the tops share
    no ancestor through layers with a map."""
    from_maps = {top_from: (None, 1, 0)}
    frontier = {top_from}
    while frontier:
        top = frontier.pop()
        try:
            for bottom in _mappable_bottoms(top):
                from_maps[bottom] = compose(from_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            pass

    to_maps = {top_to: (None, 1, 0)}
    frontier = {top_to}
    while frontier:
        top = frontier.pop()
        if top in from_maps:
            return compose(to_maps[top], inverse(from_maps[top]))
        try:
            for bottom in _mappable_bottoms(top):
                to_maps[bottom] = compose(to_maps[top], coord_map(top.fn))
                frontier.add(bottom)
        except UndefinedMapException:
            continue
    raise RuntimeError('Could not compute map between tops; are they '
                       'connected by spatial layers?')


def crop(top_from, top_to):
    """A Crop layer that crops ``top_from`` to ``top_to``'s extent, its axis and offsets
    taken from the coordinate map.  AssertionError where the scales differ or the offset
    would be negative or fractional."""
    ax, a, b = coord_map_from_to(top_from, top_to)
    assert (a == 1).all(), 'scale mismatch on crop (a = {})'.format(a)
    assert (b <= 0).all(), 'cannot crop negative offset (b = {})'.format(b)
    assert (np.round(b) == b).all(), 'cannot crop noninteger offset (b = {})'.format(b)
    return L.Crop(top_from, top_to,
                  crop_param=dict(axis=ax + 1,  # the first cropped axis
                                  offset=[int(o) for o in -np.round(b)]))
