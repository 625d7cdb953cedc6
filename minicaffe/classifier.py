"""pycaffe's ``caffe.Classifier`` (python/caffe/classifier.py in BVLC Caffe):
a TEST-phase Net that classifies (H, W, K) images, scaling them, then taking
the centre crop or pycaffe's 10 oversampled crops.

Usage, as with pycaffe and a model-zoo CaffeNet::

    import minicaffe as caffe
    mu = np.load("ilsvrc_2012_mean.npy").mean(1).mean(1)   # per-channel BGR mean
    net = caffe.Classifier("deploy.prototxt", "bvlc_reference_caffenet.caffemodel",
                           image_dims=(256, 256), mean=mu, raw_scale=255,
                           channel_swap=(2, 1, 0))
    probs = net.predict([caffe.io.load_image("cat.jpg")])   # (1, 1000)
"""
from __future__ import annotations

import numpy as np

from . import io as caffe_io
from .net import TEST, Net


class Classifier(Net):
    """A Net for class prediction with pycaffe's preprocessing.

    Args:
        model_file: the deploy prototxt (its first input is the image input).
        pretrained_file: the ``.caffemodel`` weights.
        image_dims: (height, width) the images are scaled to before cropping;
            default the input's own (H, W), so that the crop is the whole image.
        mean, input_scale, raw_scale, channel_swap: the input's
            :class:`minicaffe.io.Transformer` settings (the transpose is always
            (2, 0, 1): images (H, W, K) to inputs (K, H, W)).

    ``self.transformer``, ``self.crop_dims`` (the input's (H, W)) and
    ``self.image_dims`` are pycaffe's attributes of those names.
    """

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None,
                 input_scale=None, raw_scale=None, channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        in_, self.transformer = image_transformer(self, mean, input_scale, raw_scale,
                                                  channel_swap)
        self.crop_dims = np.array(self.blobs[in_].shape[2:])
        if image_dims is None or len(image_dims) == 0:
            image_dims = self.crop_dims
        self.image_dims = image_dims

    def predict(self, inputs, oversample=True) -> np.ndarray:
        """Class probabilities (N, classes) of N (H, W, K) images.

        As pycaffe: each image is resized to ``image_dims``
        (:func:`minicaffe.io.resize_image`); with ``oversample`` the 10 crops
        of :func:`minicaffe.io.oversample` are classified and their
        predictions averaged, else the centre crop alone; the crops are
        preprocessed by ``self.transformer`` and run through
        :meth:`forward_all`; the result is the net's first output (in name
        order), so a net whose output is not the probabilities (no Softmax at
        the end) returns whatever that output holds.
        """
        if len(inputs) == 0:
            raise ValueError("predict: no images given")
        in_ = self.inputs[0]
        image_h, image_w = (int(d) for d in self.image_dims)
        channels = np.shape(inputs[0])[2]
        scaled = np.zeros((len(inputs), image_h, image_w, channels), dtype=np.float32)
        for ix, image in enumerate(inputs):
            scaled[ix] = caffe_io.resize_image(image, (image_h, image_w))
        if oversample:
            crops = caffe_io.oversample(scaled, self.crop_dims)  # (10 N, h, w, K)
        else:
            (y0, y1), (x0, x1) = caffe_io.center_crop_bounds((image_h, image_w), self.crop_dims)
            crops = scaled[:, y0:y1, x0:x1, :]                    # (N, h, w, K)
        n, h, w, k = crops.shape
        caffe_in = np.zeros((n, k, h, w), dtype=np.float32)
        for ix, crop in enumerate(crops):
            caffe_in[ix] = self.transformer.preprocess(in_, crop)
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions


def image_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """(the input blob's name, its Transformer) for a net fed images (H, W, K), as pycaffe's
    Classifier and Detector set it up: transpose (2, 0, 1), then the optional mean, input
    scale, raw scale and channel swap."""
    if not net.inputs:
        raise ValueError(f"{net._where()}net {net.name!r} has no Input layer (or input: "
                         "field) for the images")
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return in_, transformer
