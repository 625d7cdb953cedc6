"""Caffe's schema for minicaffe: message classes, prototxt / binary I/O, and legacy upgrades.

``caffe_pb2`` mirrors protoc's generated module for ``caffe.proto`` (built from the checked-in
descriptor set, so it imports on any protobuf >= 4). ``read_net_param`` and ``read_solver_param``
parse and upgrade like Caffe's ``ReadNetParamsFromTextFileOrDie`` and
``ReadSolverParamsFromTextFileOrDie``.
"""

from . import caffe_pb2
from .text import (BinaryProtoError, PrototxtError, parse_text, read_binary, read_net_param,
                   read_solver_param, write_binary, write_text)
from .upgrade import net_needs_upgrade, upgrade_net, upgrade_solver

__all__ = [
    "caffe_pb2",
    "PrototxtError",
    "BinaryProtoError",
    "parse_text",
    "read_net_param",
    "read_solver_param",
    "write_text",
    "read_binary",
    "write_binary",
    "upgrade_net",
    "upgrade_solver",
    "net_needs_upgrade",
]
