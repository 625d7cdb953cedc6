"""Nets written in Python: pycaffe's NetSpec (``python/caffe/net_spec.py``).

Layers are built by calling the layer factory ``L`` with a Caffe type name, the
bottom tops and keyword arguments; a ``NetSpec`` names tops by attribute
assignment and turns everything it reaches into a ``NetParameter``::

    from minicaffe import layers as L, params as P, NetSpec, TRAIN
    n = NetSpec()
    n.data, n.label = L.Data(source="train_lmdb", backend=P.Data.LMDB, batch_size=64,
                             ntop=2, transform_param=dict(scale=1 / 256.),
                             include=dict(phase=TRAIN))
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.conv1, in_place=True)
    n.loss = L.SoftmaxWithLoss(n.relu1, n.label)
    net_param = n.to_proto()

Keyword arguments follow pycaffe's rules:

* ``ntop`` (number of tops, default 1; 0 returns the layer itself, as for
  ``Silence``) and ``in_place`` (the tops reuse the bottoms' names) shape the
  layer and are not written;
* a name ending in ``param`` (``param=[dict(lr_mult=1)]``,
  ``transform_param=dict(...)``, ``loss_param=...``) is a LayerParameter field;
* any other name goes to the layer type's own ``<type>_param`` message when
  that message has such a field (``kernel_size`` -> ``convolution_param``),
  else to LayerParameter itself (``include``, ``loss_weight``,
  ``propagate_down``, ``name``);
* values: a dict fills a message, a list fills a repeated field (a list of
  dicts adds one message each), a scalar given to a repeated field becomes a
  one-element list, and an enum field also takes its value's name
  (``pool="MAX"``) besides the number (``P.Pooling.MAX``).

Unlike pycaffe, a keyword that fits neither message is an error that names the
layer type, both messages and the closest field names, instead of a bare
AttributeError from protobuf.

Layer names are the names of their first top; unnamed tops (and their layers)
get pycaffe's automatic names ``<Type><k>`` (``Convolution1``, ...), numbered in
the order ``to_proto`` reaches them, so the output is deterministic.
"""
from __future__ import annotations

import difflib
import importlib
from collections import Counter, OrderedDict

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message

from .proto import caffe_pb2

# ``minicaffe.layers`` is both the package of layer implementations and (through
# its module ``__getattr__``) this module's ``L``. Import the package here, through
# the import system rather than ``from . import layers``: minicaffe's own
# ``__getattr__`` answers the name "layers" with ``L`` until the package has been
# imported, and ``from . import layers`` (as in ``minicaffe.layer.create_layer``)
# takes that answer as "already imported" and would leave the registry empty.
importlib.import_module(__package__ + ".layers")

__all__ = ["L", "P", "layers", "params", "NetSpec", "Top", "Function", "to_proto", "param_name_dict", "assign_proto"]


def param_name_dict() -> dict[str, str]:
    """Map a layer type to the stem of its LayerParameter ``*_param`` field.

    Built from the schema as pycaffe does: a field ``convolution_param`` of type
    ``ConvolutionParameter`` gives ``{"Convolution": "convolution"}``. Messages
    that are not layer types (``TransformationParameter``, ``LossParameter``)
    land in the map too and are harmless: no layer has those type names.
    """
    names = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                names[type_name[: -len("Parameter")]] = field.name[: -len("_param")]
    return names


# Layer types whose parameters live in another type's message (Caffe reads
# them there); pycaffe has no such aliases, so with it these keywords fail.
_PARAM_ALIASES = {
    "Deconvolution": "convolution",
    "Im2col": "convolution",
    "SoftmaxWithLoss": "softmax",
    "LSTM": "recurrent",
    "RNN": "recurrent",
}

_PARAM_NAMES = param_name_dict()
_PARAM_NAMES.update({k: v for k, v in _PARAM_ALIASES.items()
                     if v + "_param" in caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name})


def _is_repeated(field) -> bool:
    # protobuf >= 6 has ``is_repeated`` (and drops ``label`` in 7); older runtimes only ``label``.
    flag = getattr(field, "is_repeated", None)
    if flag is None:
        return field.label == _descriptor.FieldDescriptor.LABEL_REPEATED
    return bool(flag() if callable(flag) else flag)


def _coerce(field, value):
    """Turn ``value`` into what protobuf accepts for the scalar ``field`` (enum names
    become their numbers)."""
    if field.type == _descriptor.FieldDescriptor.TYPE_ENUM and isinstance(value, str):
        enum_value = field.enum_type.values_by_name.get(value)
        if enum_value is None:
            raise ValueError(
                f"not a value of {field.enum_type.name} "
                f"(valid: {', '.join(v.name for v in field.enum_type.values)})")
        return enum_value.number
    return value


def assign_proto(proto, name, value, where=""):
    """Assign a Python value to field ``name`` of the message ``proto``.

    Dicts fill sub-messages, lists fill repeated fields (lists of dicts add one
    message each), a scalar given to a repeated field becomes a one-element
    list, and ready-made messages are copied. ``where`` prefixes error messages.
    """
    where = where or proto.DESCRIPTOR.name
    field = proto.DESCRIPTOR.fields_by_name.get(name)
    if field is None:
        raise AttributeError(f"{where}: {proto.DESCRIPTOR.name} has no field {name!r}")
    label = f"{where}: field {proto.DESCRIPTOR.name}.{name}"
    is_message = field.type == _descriptor.FieldDescriptor.TYPE_MESSAGE
    if _is_repeated(field):
        values = value if isinstance(value, (list, tuple)) else [value]
        container = getattr(proto, name)
        for item in values:
            if is_message:
                sub = container.add()
                _fill_message(sub, item, label)
            else:
                try:
                    container.append(_coerce(field, item))
                except (TypeError, ValueError) as e:
                    raise type(e)(f"{label}: cannot take {item!r}: {e}") from None
        return
    if is_message:
        _fill_message(getattr(proto, name), value, label)
        return
    try:
        setattr(proto, name, _coerce(field, value))
    except (TypeError, ValueError) as e:
        raise type(e)(f"{label}: cannot take {value!r}: {e}") from None


def _fill_message(msg, value, where):
    if isinstance(value, _message.Message):
        if value.DESCRIPTOR is not msg.DESCRIPTOR:
            raise TypeError(f"{where}: expects a {msg.DESCRIPTOR.name}, got a "
                            f"{value.DESCRIPTOR.name}")
        msg.CopyFrom(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            assign_proto(msg, k, v, where)
    else:
        raise TypeError(f"{where}: expects a dict (or a {msg.DESCRIPTOR.name}) for the message "
                        f"{msg.DESCRIPTOR.name}, got {value!r}")


def _unknown_keyword(type_name, key, param_msg):
    candidates = list(caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name)
    where = "LayerParameter"
    if param_msg is not None:
        candidates += list(param_msg.DESCRIPTOR.fields_by_name)
        where = f"{param_msg.DESCRIPTOR.name} nor LayerParameter"
    close = difflib.get_close_matches(key, candidates, n=3)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return AttributeError(f"L.{type_name}: keyword {key!r} is a field of neither {where}{hint}")


class Top:
    """One output blob of a layer (the ``n``-th top of ``fn``)."""

    def __init__(self, fn: "Function", n: int):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter with every layer needed to compute this top."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)

    def _update(self, params: dict):
        self.fn._update(params)

    def __repr__(self):
        return f"<Top {self.n} of L.{self.fn.type_name}>"


class Function:
    """A layer: its type, its bottoms (Tops of other layers) and its keyword params."""

    def __init__(self, type_name: str, inputs, params: dict):
        for i, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                # pycaffe's exact message (python/caffe/net_spec.py, Function.__init__),
                # which its test_net_spec.py matches with a regex anchored at both ends
                raise TypeError("%s input %d is not a Top (type is %s)"
                                % (type_name, i, type(inp)))
        self.type_name = type_name
        self.inputs = tuple(inputs)
        params = dict(params)
        self.ntop = int(params.pop("ntop", 1))
        self.in_place = bool(params.pop("in_place", False))
        if self.in_place and self.ntop > len(self.inputs):
            raise ValueError(f"L.{type_name}: in_place needs a bottom for each of its "
                             f"{self.ntop} tops, got {len(self.inputs)} bottoms")
        self.params = params
        # Route and check the keywords now, so that a mistake points at the L.<Type> call.
        self._params = self._params_proto()
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _params_proto(self) -> caffe_pb2.LayerParameter:
        """A LayerParameter holding only this layer's keyword params (see the module doc)."""
        return self._params_with(self.params)

    def _params_with(self, params: dict) -> caffe_pb2.LayerParameter:
        layer = caffe_pb2.LayerParameter()
        stem = _PARAM_NAMES.get(self.type_name)
        type_param = getattr(layer, stem + "_param") if stem else None
        where = f"L.{self.type_name}"
        for key, value in params.items():
            if key.endswith("param"):
                target = layer
            elif type_param is not None and key in type_param.DESCRIPTOR.fields_by_name:
                target = type_param
            elif key in layer.DESCRIPTOR.fields_by_name:
                target = layer
            else:
                raise _unknown_keyword(self.type_name, key, type_param)
            assign_proto(target, key, value, where)
        return layer

    def _update(self, params: dict):
        """pycaffe's ``Function._update``: merge ``params`` into the layer's keyword
        params (a key given again replaces the old value), routed and checked anew."""
        merged = dict(self.params)
        merged.update(params)
        self._params = self._params_with(merged)
        self.params = merged

    def _get_top_name(self, top, names, autonames):
        if top not in names:
            autonames[self.type_name] += 1
            names[top] = f"{self.type_name}{autonames[self.type_name]}"
        return names[top]

    def _get_name(self, names, autonames):
        if self not in names:
            if self.ntop > 0:
                names[self] = self._get_top_name(self.tops[0], names, autonames)
            else:
                autonames[self.type_name] += 1
                names[self] = f"{self.type_name}{autonames[self.type_name]}"
        return names[self]

    def _to_proto(self, layers, names, autonames):
        """Add this layer (after the layers it reads) to ``layers``."""
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(bottom_names[: self.ntop])
        else:
            layer.top.extend(self._get_top_name(t, names, autonames) for t in self.tops)
        layer.name = self._get_name(names, autonames)

        layer.MergeFrom(self._params)
        layers[self] = layer

    def __repr__(self):
        return f"<L.{self.type_name} with {len(self.inputs)} bottoms, {self.ntop} tops>"


def to_proto(*tops) -> caffe_pb2.NetParameter:
    """A NetParameter with every layer needed to compute ``tops`` (auto-named)."""
    layers = OrderedDict()
    names: dict = {}
    autonames: Counter = Counter()
    for top in tops:
        top._to_proto(layers, names, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class NetSpec:
    """Tops named by attribute (or item) assignment; ``to_proto`` emits the net.

    Every assigned top names its blob (and its layer, for a layer's first top).
    Layers that only feed assigned tops are included with automatic names.
    """

    def __init__(self):
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name, value):
        if not isinstance(value, (Top, Function)):
            raise TypeError(
                f"NetSpec.{name}: expects a top made by L.<Type>(...), got {value!r} (a layer with "
                "ntop > 1 returns a tuple: unpack it, e.g. n.data, n.label = L.Data(..., ntop=2))")
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top {name!r}") from None

    __setitem__ = __setattr__

    def __getitem__(self, name):
        return self.tops[name]

    def __delitem__(self, name):
        del self.tops[name]

    def __contains__(self, name):
        return name in self.tops

    def keys(self):
        return list(self.tops)

    def vals(self):
        return list(self.tops.values())

    def update(self, name, params: dict):
        """pycaffe's ``NetSpec.update``: merge ``params`` into the keyword params of the
        layer that made top ``name`` (``n.update("conv1", dict(num_output=64))``)."""
        self.tops[name]._update(params)

    def to_proto(self) -> caffe_pb2.NetParameter:
        names = {top: name for name, top in self.tops.items()}
        autonames: Counter = Counter()
        layers = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """The layer factory: ``L.<Type>(*bottoms, **params)`` makes a layer of that type.

    Returns its top (one top), a tuple of tops (``ntop`` > 1) or the layer
    itself (``ntop=0``).
    """

    def __getattr__(self, type_name):
        if type_name.startswith("__"):
            raise AttributeError(type_name)

        def layer_fn(*args, **kwargs):
            fn = Function(type_name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops

        layer_fn.__name__ = type_name
        layer_fn.__doc__ = f"Make a {type_name} layer: L.{type_name}(*bottoms, **params)."
        return layer_fn


class _EnumValues:
    """``P.<Type>.<VALUE>``: the enum constants of ``<Type>Parameter``."""

    def __init__(self, type_name):
        self._type_name = type_name

    def __getattr__(self, value_name):
        if value_name.startswith("__"):
            raise AttributeError(value_name)
        cls = getattr(caffe_pb2, self._type_name + "Parameter", None)
        if cls is None:
            raise AttributeError(f"P.{self._type_name}: caffe_pb2 has no message "
                                 f"{self._type_name}Parameter")
        try:
            return getattr(cls, value_name)
        except AttributeError:
            values = [v.name for e in cls.DESCRIPTOR.enum_types for v in e.values]
            raise AttributeError(
                f"P.{self._type_name}.{value_name}: no such value in {self._type_name}Parameter "
                f"(its enum values: {', '.join(values) or 'none'})") from None


class Parameters:
    """Enum constants by layer type, as pycaffe's ``caffe.params``: ``P.Pooling.MAX``."""

    def __getattr__(self, type_name):
        if type_name.startswith("__"):
            raise AttributeError(type_name)
        return _EnumValues(type_name)


L = Layers()
P = Parameters()
# pycaffe's net_spec module names them so (``from caffe.net_spec import layers as L``)
layers = L
params = P
