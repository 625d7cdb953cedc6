"""Message classes of Caffe's schema, built at import time from the checked-in descriptor set.

This module stands in for protoc's generated ``caffe_pb2``: it has the same attributes (one class
per top-level message, with nested messages and enum values on the classes; top-level enums such
as ``Phase`` and their values ``TRAIN``/``TEST``; ``DESCRIPTOR``), so code written against Caffe's
Python bindings reads the same. It is not generated code because generated modules refuse to
import under a protobuf runtime older than the protoc that made them, and the GPU machine's runtime
is older than ours; a serialized FileDescriptorSet loads on every runtime >= 4.

The classes live in a private DescriptorPool, not the process-wide default one, so a second copy of
caffe.proto loaded by another library (OpenCV, a real Caffe install) cannot clash with this one.

Regenerate ``caffe_descriptor.bin`` with ``python scripts/gen_proto.py`` after editing caffe.proto.
"""

import os

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

_DESCRIPTOR_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "caffe_descriptor.bin")


def _load_pool(path):
    with open(path, "rb") as f:
        file_set = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    # --include_imports lists dependencies first, so each file's imports are already in the pool.
    for file_proto in file_set.file:
        pool.AddSerializedFile(file_proto.SerializeToString())
    return pool


def _message_class(desc):
    # GetMessageClass appeared in protobuf 4.21.x/4.22; MessageFactory.GetPrototype is its
    # predecessor and was removed in later releases, so try the new name first.
    get_message_class = getattr(message_factory, "GetMessageClass", None)
    if get_message_class is not None:
        return get_message_class(desc)
    return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


_POOL = _load_pool(_DESCRIPTOR_PATH)
DESCRIPTOR = _POOL.FindFileByName("caffe.proto")

# Top-level messages. Nested messages (none in caffe.proto) and nested enums, e.g.
# PoolingParameter.MAX or PoolingParameter.PoolMethod, are attributes of these classes already.
for _name, _desc in DESCRIPTOR.message_types_by_name.items():
    _cls = _message_class(_desc)
    try:
        # Point the class at this module, as a generated class would be, so that pickle (which
        # multiprocessing uses) can find it again by name.
        _cls.__module__ = __name__
    except (AttributeError, TypeError):
        pass
    globals()[_name] = _cls

# Top-level enums: the wrapper (Phase.Name(0) == "TRAIN") and each value as a module constant.
for _name, _desc in DESCRIPTOR.enum_types_by_name.items():
    globals()[_name] = enum_type_wrapper.EnumTypeWrapper(_desc)
    for _value in _desc.values:
        globals()[_value.name] = _value.number

__all__ = sorted(
    list(DESCRIPTOR.message_types_by_name)
    + list(DESCRIPTOR.enum_types_by_name)
    + [v.name for e in DESCRIPTOR.enum_types_by_name.values() for v in e.values]
)

del _name, _desc, _cls, _value
