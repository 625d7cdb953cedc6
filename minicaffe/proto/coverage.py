"""caffe.proto fields that minicaffe parses but that do not act here as a user may expect.

docs/PROTO_COVERAGE.md tables every field of the schema that is not simply read and acted on
as BVLC Caffe acts on it (tests/test_caffe_proto_coverage.py keeps that table complete).
Most of its entries need nothing: BVLC Caffe ignores them too (an engine hint that leaves the
numbers as they are, a deprecated field that upstream stopped reading), so the net is the
one Caffe builds.  The few fields named here are those whose effect a prototxt's author could
count on and would not get, from minicaffe or from upstream Caffe either: the net says so,
once per layer, as a warning that starts with the prototxt's file and the layer's line
(``Net._init`` calls :func:`unread_fields` for each layer it builds, before the layer).
"""
from __future__ import annotations

import warnings


class UnreadFieldWarning(UserWarning):
    """A prototxt field that is parsed but does not act here (see the module doc)."""


# RecurrentLayer subclasses: their recurrent_param.debug_info is Caffe's unrolled net's
RECURRENT_TYPES = ("RNN", "LSTM")


def unread_fields(lp) -> list[tuple[str, str]]:
    """``(field, why)`` for each field of LayerParameter ``lp`` that is set and does not act
    here as its author may expect (an empty list for nearly every layer)."""
    out = []
    if lp.type == "Data" and lp.data_param.rand_skip:
        # data_layer.cpp (upstream master, and the DataReader of 2015 before it) starts at the
        # first record and never reads rand_skip; only ImageData still skips
        # (image_data_layer.cpp: lines_id_ = caffe_rng_rand() % rand_skip).
        out.append(("data_param.rand_skip",
                    f"{lp.data_param.rand_skip} is ignored, as BVLC Caffe's Data layer ignores "
                    "it (no upstream Data layer has read it since 2015): reading starts at the "
                    "first record; ImageData's image_data_param.rand_skip does skip"))
    if lp.type in RECURRENT_TYPES and lp.recurrent_param.debug_info:
        # recurrent_layer.cpp: unrolled_net_->set_debug_info(debug_info), so Caffe logs the
        # mean |data| and |diff| of every blob of the unrolled net in each pass
        out.append(("recurrent_param.debug_info",
                    "minicaffe computes this layer without Caffe's unrolled net, whose "
                    "per-time-step blobs Caffe's debug_info logs; nothing is logged"))
    return out


def warn_unread_fields(lp, at: str = "") -> list[str]:
    """Warn (:class:`UnreadFieldWarning`) about each of :func:`unread_fields`, each message
    starting with ``at`` (``file:line: `` of the layer) and naming the layer and the field;
    returns the messages."""
    msgs = [f"{at}layer {lp.name!r} (type {lp.type}): {field}: {why}"
            for field, why in unread_fields(lp)]
    for msg in msgs:
        warnings.warn(msg, UnreadFieldWarning, stacklevel=3)
    return msgs
