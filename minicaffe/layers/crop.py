"""Crop (Caffe's ``CropLayer``): cut bottom 0 to the extent of bottom 1.

Axes from ``crop_param.axis`` on (default 2; negative counts from the end) take bottom
1's sizes, starting at ``crop_param.offset`` in bottom 0: no offset means 0, one offset
serves every cropped axis, several give one per cropped axis (exactly as many as there
are axes from ``axis`` on).  Earlier axes are kept whole, and bottom 1's sizes there do
not matter.  FCN crops its upsampled scores (N, 21, H', W') to the image (N, 3, H, W)
with ``axis: 2 offset: 19``:

    bottom 0  (N, C, H0, W0)      the data
    bottom 1  (., ., H1, W1)      only its shape is read
    top       (N, C, H1, W1)      = bottom0[:, :, oh:oh+H1, ow:ow+W1]

Backward reads no data: bottom 0's diff is the top diff inside the window and zero
elsewhere (overwritten).  Bottom 1 gets no gradient; Caffe leaves its diff alone (zero,
as Caffe allocates it), here it is written with zeros where asked for, since a memory
plan may hand it memory that held something else.
"""
from __future__ import annotations

from ..layer import Layer, register_layer


@register_layer
class CropLayer(Layer):
    """Crop the trailing axes of bottom 0 to bottom 1's extent at given offsets."""

    type = "Crop"
    exact_num_bottom = 2
    exact_num_top = 1
    backward_reads_bottom = ()

    def layer_setup(self, bottom, top):
        p = self.param.crop_param
        self._where = f"layer {self.name!r} (Crop): "
        self.given_offsets = tuple(int(o) for o in p.offset)
        self.start_axis = self._check_axes(bottom[0])

    def _check_axes(self, x) -> int:
        """Caffe's LayerSetUp checks: the first cropped axis, canonical, and the offsets'
        count against the cropped axes of ``x``."""
        axis, n = int(self.param.crop_param.axis), x.ndim
        if not -n <= axis < n:
            raise ValueError(f"{self._where}crop axis {axis} out of range for bottom {x.name!r} "
                             f"of shape {x.shape} ({n} axes)")
        start = axis % n
        k = len(self.given_offsets)
        if k > 1 and start + k != n:
            raise ValueError(
                f"{self._where}number of offset values specified must be equal to the number "
                f"of dimensions following axis: {k} offsets given, bottom {x.name!r} of shape "
                f"{x.shape} has {n - start} axes from axis {start} on")
        return start

    def reshape(self, bottom, top):
        x, ref = bottom
        if top[0] is x or top[0] is ref:
            raise ValueError(f"{self._where}Crop does not allow in-place computation")
        self.start_axis = self._check_axes(x)
        n = x.ndim
        if ref.ndim < n:
            raise ValueError(
                f"{self._where}bottom 1 {ref.name!r} of shape {ref.shape} has fewer axes than "
                f"bottom 0 {x.name!r} of shape {x.shape}: it must give the size of every "
                f"cropped axis ({self.start_axis} to {n - 1})")
        shape, offsets = list(x.shape), [0] * n
        for i in range(self.start_axis, n):
            k = len(self.given_offsets)
            off = 0 if k == 0 else self.given_offsets[0 if k == 1 else i - self.start_axis]
            size = ref.shape[i]
            if x.shape[i] - off < size:
                raise ValueError(
                    f"{self._where}the crop for dimension {i} is out-of-bounds with size {size} "
                    f"(of bottom 1 {ref.name!r}, shape {ref.shape}) and offset {off}: bottom 0 "
                    f"{x.name!r} of shape {x.shape} has only {x.shape[i]} there")
            shape[i], offsets[i] = size, off
        self.offsets = tuple(offsets)
        # bottom 0's window that the top copies
        self.window = tuple(slice(o, o + s) for o, s in zip(offsets, shape))
        top[0].reshape(tuple(shape))

    def forward_impl(self, bottom, top):
        top[0].data[...] = bottom[0].data[self.window]

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[1]:
            bottom[1].diff[...] = 0     # first: bottom 1 may be bottom 0's very blob
        if propagate_down[0]:
            dx = bottom[0].diff
            dx[...] = 0
            dx[self.window] = top[0].diff

    def flops(self, bottom, top):
        """Copies only: the elements moved (the performance model's measure of a copy's
        work): forward the window; backward zeroes the bottom's diff and copies the window."""
        n = float(top[0].count)
        return n, float(bottom[0].count) + n
