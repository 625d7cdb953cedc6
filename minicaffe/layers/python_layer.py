"""Python, as BVLC Caffe built WITH_PYTHON_LAYER (``include/caffe/layers/python_layer.hpp``,
``src/caffe/layer_factory.cpp``'s ``GetPythonLayer``, the ``Layer`` class of
``python/caffe/_caffe.cpp``).

A research prototxt names a class of a Python module::

    layer { name: "loss" type: "Python" bottom: "pred" bottom: "label" top: "loss"
            python_param { module: "pyloss" layer: "EuclideanLossLayer" param_str: "..." }
            loss_weight: 1 }

and the module, found on ``sys.path`` (``PYTHONPATH``) as Caffe finds it, defines it
pycaffe's way::

    import minicaffe as caffe

    class EuclideanLossLayer(caffe.Layer):
        def setup(self, bottom, top): ...            # once: check, parse self.param_str
        def reshape(self, bottom, top): ...          # shape the tops
        def forward(self, bottom, top): ...          # top[i].data[...] = ...
        def backward(self, top, propagate_down, bottom): ...   # bottom[i].diff[...] = ...

The registered layer, :class:`PythonLayer`, is a framework layer that *wraps* an
instance of that class (Caffe's ``PythonLayer`` holds the Python object ``self_`` the
same way) and drives it through Caffe's contract:

* construction imports ``python_param.module`` and calls ``python_param.layer(param)``
  with the LayerParameter (``GetPythonLayer``); the class must subclass
  ``minicaffe.Layer`` (pycaffe's ``caffe.Layer``);
* ``LayerSetUp`` sets ``param_str`` (a str) and ``phase`` (``caffe.TRAIN`` 0 or
  ``caffe.TEST`` 1) on the instance, then calls its ``setup(bottom, top)``; the net then
  calls ``reshape`` and sets the loss weights (Caffe's ``Layer::SetUp``);
* ``forward`` calls the instance's ``reshape`` and then its ``forward`` each time (Caffe's
  ``Layer::Forward`` reshapes before every ``Forward_cpu``), also right after a set-up or a
  ``net.reshape()`` that called ``reshape`` already, as Caffe does (a ``reshape`` that loads
  the next batch sees the calls that Caffe makes); ``backward`` calls ``backward(top, propagate_down, bottom)``, only when the
  net needs this layer's backward.  The loss of a top with a ``loss_weight`` is computed
  here from the top's data, as for every layer: a Python loss layer writes its loss into
  its top and gets ``loss_weight: 1`` in the prototxt (Caffe's PythonLayer is no loss
  layer by default);
* ``bottom`` and ``top`` are lists of :class:`minicaffe.Blob`, with pycaffe's ``data``,
  ``diff``, ``shape``, ``reshape(*shape)``, ``count``, ``num``, ``channels``, ``height``
  and ``width``;
* ``self.blobs`` is a :class:`BlobVec`, a list with pycaffe's ``add_blob(*shape)``: the
  learnable parameters, zero-filled, that the solver updates (``lr_mult`` 1 unless a
  ``param {}`` says otherwise) and ``.caffemodel`` files save and load.  Their diffs
  accumulate across backward calls, as every layer's (the solver clears them).

Arrays: on the CPU ``bottom[i].data`` is a NumPy array, as pycaffe's ``mutable_cpu_data``.
In GPU mode minicaffe does *not* copy to the host as Caffe does: the layer gets CuPy arrays
on the device (no hidden transfer).  ``self.xp`` is the array module of the net (numpy or
cupy); a layer written for NumPy only must copy itself (``cupy.asnumpy``, then
``top[0].data[...] = cupy.asarray(...)``).  A Python layer is never captured in a CUDA
graph (minicaffe/graph.py: its type is not known to be capturable).

Memory planner (swap/): what a Python layer's backward reads cannot be known, so it
declares that backward reads the data of every bottom and every top, and it keeps no
internals.  Arrays that the user's code keeps between calls are its own memory, outside any
plan; it must read blobs through ``blob.data``/``blob.diff`` at each call, never through a
view kept from an earlier call (a plan may move a blob between calls).

Errors: a module that cannot be imported, a missing class, a class that is not a
``caffe.Layer``, and a missing ``python_param`` are errors that name the layer and the
module.  An exception raised inside the user's methods propagates unchanged (its type, as
pycaffe's do through boost.python) with a note naming the layer, its class and the method.

``share_in_parallel`` (Caffe's ``ShareInParallel``) is read and exposed; minicaffe has no
in-process multi-solver training to share an instance among (a parameter-server worker is
a process with its own net), so it changes nothing.
"""
from __future__ import annotations

import importlib
import numbers

import numpy as np

from ..blob import Blob
from ..layer import BackwardReads, Layer, ParamBlobs, register_layer
from ..proto import caffe_pb2

# The methods of a pycaffe layer; ``setup`` may be left out (pycaffe's base is a no-op).
_METHODS = ("setup", "reshape", "forward", "backward")


class BlobVec(ParamBlobs):
    """pycaffe's ``BlobVec``: a layer's parameter blobs, with ``add_blob(*shape)``.

    Args:
        layer: the user's layer instance (a ``minicaffe.Layer``) whose array module, dtype
            and name the new blobs take.
    """

    def __init__(self, layer):
        super().__init__((), getattr(layer, "name", ""))
        self._layer = layer

    def add_blob(self, *shape) -> Blob:
        """Append a zero-filled blob of ``shape`` (``add_blob(10, 3)``; pycaffe takes ints
        only, no keywords).  Returns it (pycaffe returns None)."""
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, numbers.Integral):
                raise TypeError(
                    f"layer {self._layer.name!r}: add_blob takes the dimensions as integers, "
                    f"add_blob(2, 3); got {shape!r}")
        # storage is allocated on first access, zero-filled, as pycaffe's new Blob reads
        blob = self._layer.make_param_blob(shape, len(self))
        self.append(blob)
        return blob


def _add_note(exc: BaseException, note: str):
    """``exc.add_note`` (Python 3.11); on 3.10 the note is kept in ``__notes__`` only."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]


@register_layer
class PythonLayer(Layer):
    """Caffe's ``PythonLayer``: runs the ``python_param.layer`` class of
    ``python_param.module`` (see the module doc).

    ``user_layer`` is the user's instance, what pycaffe's ``net.layers[i]`` returns for a
    Python layer: any attribute this wrapper does not have is the user's, so
    ``solver.net.layers[0].set_roidb(roidb)`` (py-faster-rcnn's pattern) works as in pycaffe,
    and assigning one of the user's own attributes through the net
    (``net.layers[0].batch_size = 16``) sets it on the user's instance, which pycaffe's
    ``net.layers[0]`` is.  ``blobs`` is the user's ``self.blobs`` (one list).
    """

    def __getattr__(self, name):
        # only reached for attributes the wrapper lacks; before __init__ has set user_layer
        # there is nothing to delegate to
        user = self.__dict__.get("user_layer")
        if user is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(user, name)

    def __setattr__(self, name, value):
        # an attribute that the user's instance or class has and the wrapper does not (those
        # are read from the user's, above) is the user's to change; the rest is the wrapper's
        user = self.__dict__.get("user_layer")
        if (user is not None and name not in self.__dict__ and not hasattr(type(self), name)
                and hasattr(user, name)):
            setattr(user, name, value)
        else:
            object.__setattr__(self, name, value)

    type = "Python"
    # Any number of bottoms and tops (Caffe's PythonLayer constrains neither).
    # Caffe's Layer constructor fills blobs_ from LayerParameter.blobs before the user's
    # setup runs.
    definition_blobs_first = True
    # Caffe's Layer::Forward calls Reshape first, every time: the user's reshape may
    # depend on the layer's own state, so the net leaves the reshaping to forward_impl
    reshapes_in_forward = True

    def __init__(self, param, xp=np, dtype=np.float32):
        super().__init__(param, xp=xp, dtype=dtype)
        pp = param.python_param
        self.module_name = pp.module
        self.class_name = pp.layer
        self.param_str = pp.param_str
        self.share_in_parallel = pp.share_in_parallel
        where = f"layer {self.name!r} of type Python"
        if not pp.module or not pp.layer:
            raise ValueError(
                f"{where}: python_param {{ module: \"...\" layer: \"...\" }} must name a Python "
                f"module and a class in it (got module {pp.module!r}, layer {pp.layer!r})")
        if pp.module.endswith(".py") or "/" in pp.module or "\\" in pp.module:
            # Caffe's bp::import(module): a module name, never a file; importlib would say
            # "'mylayer' is not a package" or ask for a package (TypeError) instead
            name = pp.module.replace("\\", "/").rsplit("/", 1)[-1]
            name = name[:-3] if name.endswith(".py") else name
            raise ImportError(
                f"{where}: python_param.module {pp.module!r} is a file name; it takes the "
                f"module's name as `import` does (module: \"{name}\"), with its folder on "
                "sys.path (PYTHONPATH)", name=pp.module)
        try:
            module = importlib.import_module(pp.module)
        except ImportError as e:
            raise ImportError(
                f"{where}: cannot import python_param.module {pp.module!r} ({e}); the module "
                "must be on sys.path (PYTHONPATH), as Caffe requires", name=pp.module) from e
        except Exception as e:                       # the module's own code failed
            _add_note(e, f"raised importing python_param.module {pp.module!r} of {where}")
            raise
        cls = getattr(module, pp.layer, None)
        if cls is None:
            raise ImportError(
                f"{where}: module {pp.module!r} ({getattr(module, '__file__', '?')}) has no "
                f"class {pp.layer!r} (python_param.layer)", name=pp.module)
        if not (isinstance(cls, type) and issubclass(cls, Layer)):
            raise TypeError(
                f"{where}: {pp.module}.{pp.layer} must be a class derived from caffe.Layer "
                f"(minicaffe.Layer), got {cls!r}")
        self._where = f"Python layer {self.name!r} ({pp.module}.{pp.layer})"
        # GetPythonLayer: module.attr(layer)(param), the LayerParameter as the one argument
        user = self._call(cls, "__init__", param)
        user.xp, user.dtype = self.xp, self.dtype
        user.type = self.type
        user.blobs = BlobVec(user)
        user.param_str = self.param_str
        self.user_layer = user
        self.blobs = user.blobs
        self._defines = {m: getattr(cls, m) is not getattr(Layer, m) for m in _METHODS}
        self._num_top = 0

    # ------------------------------------------------------------ calling the user
    def _call(self, fn, method: str, *args):
        """Call ``fn`` (a user method); an exception keeps its type and gains a note that
        names this layer and the method."""
        try:
            return fn(*args)
        except Exception as e:
            _add_note(e, f"raised in {method}() of {self._where}")
            raise

    def _user(self, method: str):
        if not self._defines[method]:
            raise NotImplementedError(
                f"{self._where} defines no {method}(); a Python layer's class defines "
                "setup (optional), reshape, forward and backward")
        return getattr(self.user_layer, method)

    # ---------------------------------------------------------------- set up
    def layer_setup(self, bottom, top):
        """Caffe's PythonLayer::LayerSetUp: param_str and phase, then setup()."""
        from ..common import multiprocess, solver_count
        if self.phase == caffe_pb2.TRAIN and solver_count() > 1 and not multiprocess():
            # Caffe: several solvers in one process would share the GIL (BVLC/caffe#2936)
            raise RuntimeError(f"{self._where}: PythonLayer does not support CLI Multi-GPU, "
                               "use train.py (caffe.solver_count() is "
                               f"{solver_count()} without caffe.set_multiprocess(True))")
        self._num_top = len(top)
        user = self.user_layer
        user.param_str = self.param_str
        user.phase = int(self.phase)
        if self._defines["setup"]:
            self._call(user.setup, "setup", bottom, top)

    def reshape(self, bottom, top):
        self._call(self._user("reshape"), "reshape", bottom, top)

    # ----------------------------------------------------- forward/backward
    def forward_impl(self, bottom, top):
        # Caffe's Layer::Forward reshapes before every Forward_cpu, even right after the
        # net's set-up or Reshape did: a layer whose top shape follows its own state (a
        # Python data layer) may change it here, and a reshape with side effects (one
        # that loads the next batch) runs as often as in Caffe
        self._call(self._user("reshape"), "reshape", bottom, top)
        self._call(self._user("forward"), "forward", bottom, top)

    def backward_impl(self, top, propagate_down, bottom):
        self._call(self._user("backward"), "backward", top, list(propagate_down), bottom)

    # ---------------------------------------------------------- declarations
    def backward_reads(self) -> BackwardReads:
        """Unknown, so everything: the data of every bottom and every top; no internals."""
        return BackwardReads(bottom=tuple(range(self._num_bottom)),
                             top=tuple(range(self._num_top)))

    def __repr__(self):
        return f"<Python layer {self.name!r} ({self.module_name}.{self.class_name})>"
