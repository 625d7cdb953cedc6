"""pycaffe's ``caffe.Detector`` (python/caffe/detector.py in BVLC Caffe): a
TEST-phase Net that classifies windows (boxes) of images, as in R-CNN
(Girshick et al., "Rich feature hierarchies for accurate object detection and
semantic segmentation", arXiv:1311.2524): each window is cropped, optionally
with a border of surrounding context, warped to the input size, preprocessed
and batched through the net.

Usage, as with pycaffe::

    import minicaffe as caffe
    det = caffe.Detector("deploy.prototxt", "weights.caffemodel",
                         mean=np.array([104., 117., 123.]), raw_scale=255,
                         channel_swap=(2, 1, 0), context_pad=16)
    dets = det.detect_windows([("cat.jpg", np.array([[10, 20, 200, 220]]))])
    dets[0]["prediction"]   # the net's first output for that window

Windows are (ymin, xmin, ymax, xmax) in pixels of the loaded image.

Selective search proposals (``detect_selective_search``) need the third-party
``selective_search_ijcv_with_python`` package (and MATLAB), which is not
bundled: https://github.com/sergeyk/selective_search_ijcv_with_python
"""
from __future__ import annotations

import os

import numpy as np

from . import io as caffe_io
from .classifier import image_transformer
from .net import TEST, Net

SELECTIVE_SEARCH_PACKAGE = "selective_search_ijcv_with_python"
SELECTIVE_SEARCH_URL = "https://github.com/sergeyk/selective_search_ijcv_with_python"


class Detector(Net):
    """A Net for windowed detection over lists of windows or selective search
    proposals.

    Args:
        model_file: the deploy prototxt (its first input is the image input).
        pretrained_file: the ``.caffemodel`` weights.
        mean, input_scale, raw_scale, channel_swap: the input's
            :class:`minicaffe.io.Transformer` settings (the transpose is always
            (2, 0, 1): crops (H, W, K) to inputs (K, H, W)).
        context_pad: pixels of the (square) net input that hold context around
            the window, as R-CNN's feature extraction; None or 0 for none.

    ``self.transformer``, ``self.crop_dims`` (the input's (H, W, K)),
    ``self.context_pad`` and, with context, ``self.crop_mean`` are pycaffe's
    attributes of those names.
    """

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None, context_pad=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        in_, self.transformer = image_transformer(self, mean, input_scale, raw_scale,
                                                  channel_swap)
        self.configure_crop(context_pad)

    # ------------------------------------------------------------ detection
    def detect_windows(self, images_windows) -> list:
        """Classify windows of images.

        Args:
            images_windows: (image filename, windows) pairs; windows is a
                sequence of (ymin, xmin, ymax, xmax).

        Returns:
            one dict per window, in input order (images as given, each
            image's windows as given): ``{'window': the window as passed,
            'prediction': the net's first output for it, 'filename': the image
            filename}``.

        Each image is loaded once (:func:`minicaffe.io.load_image`, float32 RGB
        in [0, 1]); every window is cut by :meth:`crop`, warped and
        preprocessed by ``self.transformer`` into an (N, K, H, W) batch that
        goes through :meth:`forward_all`.
        """
        # pycaffe walks images_windows twice, which drops every detection when
        # it is an iterator (detect_selective_search's zip under Python 3);
        # one list serves both walks here.
        images_windows = [(fname, list(windows)) for fname, windows in images_windows]
        window_inputs = []                      # N crops, each (h, w, K)
        for image_fname, windows in images_windows:
            image = caffe_io.load_image(image_fname).astype(np.float32)
            for window in windows:
                window_inputs.append(self.crop(image, window))
        if not window_inputs:
            raise ValueError("detect_windows: no windows given")

        in_ = self.inputs[0]
        caffe_in = np.zeros((len(window_inputs), window_inputs[0].shape[2])
                            + tuple(self.blobs[in_].shape[2:]), dtype=np.float32)
        for ix, window_in in enumerate(window_inputs):
            caffe_in[ix] = self.transformer.preprocess(in_, window_in)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]

        detections = []
        ix = 0
        for image_fname, windows in images_windows:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[ix],
                                   "filename": image_fname})
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames) -> list:
        """:meth:`detect_windows` over the selective search proposals of each
        image (R-CNN's ``selective_search_rcnn`` command), filenames made
        absolute as pycaffe does (for MATLAB).

        Needs the ``selective_search_ijcv_with_python`` package; an
        ImportError names it when it is missing.
        """
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError as e:
            raise ImportError(
                f"Detector.detect_selective_search needs the {SELECTIVE_SEARCH_PACKAGE} "
                f"package (and MATLAB), which is not installed: get it from "
                f"{SELECTIVE_SEARCH_URL} and put it on PYTHONPATH, or pass your own "
                "windows to detect_windows") from e
        image_fnames = [os.path.abspath(f) for f in image_fnames]
        windows_list = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows_list))

    # ------------------------------------------------------------- cropping
    def crop(self, im, window) -> np.ndarray:
        """Cut ``window`` = (ymin, xmin, ymax, xmax) out of the (H, W, K)
        image ``im``.

        Without context: ``im[ymin:ymax, xmin:xmax]`` (ymax, xmax excluded),
        any size; the transformer warps it later.

        With ``context_pad`` p and a square input of side S, as pycaffe: the
        window, taken as inclusive of ymax/xmax (height ymax - ymin + 1), is
        grown about its centre by ``scale = S / (S - 2 p)``, so that once it
        is warped to S x S the window fills the middle S - 2p pixels; the grown
        box is rounded (half to even) and clipped to the image, the clipped
        part resized (:func:`minicaffe.io.resize_image`) by the grown box's
        S/height and S/width, and placed in an (S, S, K) canvas filled with
        ``crop_mean`` (the mean in raw image units), offset by the rounded
        scaled amount the box stuck out past the top and left edges. Past the
        bottom and right edges the placed crop is shorter and the rest of the
        canvas stays the mean.

        Differences from pycaffe's code: its float box corners are used as
        slice indices, which NumPy >= 1.12 rejects; they are integers here (the
        box is rounded and clipped, so their values are the same).  The scalar
        rounding is Python 3's ``round`` (half to even), as pycaffe's code
        runs under Python 3; Python 2 rounded halves up.
        """
        # window rows ymin..ymax-1, columns xmin..xmax-1: (h, w, K), a view
        crop = im[int(window[0]):int(window[2]), int(window[1]):int(window[3])]
        if not self.context_pad:
            return crop

        box = np.array(window, dtype=np.float64)      # (ymin, xmin, ymax, xmax)
        crop_size = int(self.crop_dims[1])            # the input's width; square input
        scale = crop_size / (1.0 * crop_size - self.context_pad * 2)
        # grow the box about its centre by `scale`
        half_h = (box[2] - box[0] + 1) / 2.0
        half_w = (box[3] - box[1] + 1) / 2.0
        center = (box[0] + half_h, box[1] + half_w)
        scaled_dims = scale * np.array((-half_h, -half_w, half_h, half_w))
        box = np.round(np.tile(center, 2) + scaled_dims)
        full_h = box[2] - box[0] + 1
        full_w = box[3] - box[1] + 1
        scale_h = crop_size / full_h                  # image pixels -> input pixels
        scale_w = crop_size / full_w
        pad_y = round(max(0, -box[0]) * scale_h)      # what sticks out, top / left
        pad_x = round(max(0, -box[1]) * scale_w)

        # clip the box to the image (to H and W themselves, as pycaffe)
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h = box[2] - box[0] + 1
        clip_w = box[3] - box[1] + 1
        assert clip_h > 0 and clip_w > 0
        crop_h = round(clip_h * scale_h)
        crop_w = round(clip_w * scale_w)
        if pad_y + crop_h > crop_size:
            crop_h = crop_size - pad_y
        if pad_x + crop_w > crop_size:
            crop_w = crop_size - pad_x

        # the clipped context, warped, on a canvas of the mean
        y0, x0, y1, x1 = (int(c) for c in box)
        context_crop = caffe_io.resize_image(im[y0:y1, x0:x1], (crop_h, crop_w))
        crop = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean   # (S, S, K)
        crop[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context_crop
        return crop

    def configure_crop(self, context_pad) -> None:
        """Set ``crop_dims``, the input's (H, W, K), and ``context_pad``; with
        context, also ``crop_mean``, the canvas fill of :meth:`crop`: the
        transformer's mean taken back to raw image units (transposed to
        (H, W, K) or (1, 1, K), channel swap undone, divided by raw_scale),
        zeros when there is no mean.  The input scale is not undone, as in
        pycaffe.
        """
        in_ = self.inputs[0]
        tpose = self.transformer.transpose[in_]
        inv_tpose = [tpose[t] for t in tpose]     # (2, 0, 1) -> (1, 2, 0)
        self.crop_dims = np.array(self.blobs[in_].shape[1:])[inv_tpose]
        self.context_pad = context_pad
        if not self.context_pad:
            return
        if self.crop_dims[0] != self.crop_dims[1]:
            # pycaffe takes the width as the side and fails or misplaces the crop
            raise ValueError(f"Detector: context_pad needs a square input; input {in_!r} is "
                             f"{tuple(self.blobs[in_].shape)}")
        side = int(self.crop_dims[0])
        if 2 * context_pad >= side:
            # crop() grows each window by S / (S - 2 p): at p >= S / 2 the scale is infinite
            # or negative (pycaffe fails an assert in crop, on the first window)
            raise ValueError(f"Detector: context_pad {context_pad} leaves no room for the "
                             f"window in input {in_!r} of side {side}: give at most "
                             f"{(side - 1) // 2} (the pad is taken from both sides)")
        channel_order = self.transformer.channel_swap.get(in_)
        raw_scale = self.transformer.raw_scale.get(in_)
        mean = self.transformer.mean.get(in_)     # (K, 1, 1) or (K, H, W)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        crop_mean = np.array(mean, dtype=np.float64).transpose(inv_tpose)
        if channel_order is not None:
            channel_order = list(channel_order)
            crop_mean = crop_mean[:, :, [channel_order.index(i)
                                         for i in range(crop_mean.shape[2])]]
        if raw_scale is not None:
            crop_mean /= raw_scale
        self.crop_mean = crop_mean
