"""minicaffe: a small Caffe-faithful CNN framework on NumPy (CPU) and CuPy (GPU).

The Python API follows pycaffe::

    import minicaffe as caffe
    net = caffe.Net("deploy.prototxt", caffe.TEST, weights="model.caffemodel")
    net.blobs["data"].data[...] = images
    out = net.forward()
    solver = caffe.get_solver("solver.prototxt")
    solver.step(100)
"""
from .backend import set_device, set_mode_cpu, set_mode_gpu, gpu_available
from .blob import Blob
from .layer import Layer, register_layer, known_layer_types
from .net import TEST, TRAIN, Net
from .proto import caffe_pb2
from .solver import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver, RMSPropSolver,
                     SGDSolver, Solver, get_solver)
from .rng import set_random_seed
from . import layers  # registers every layer; also pycaffe's `layers as L` NetSpec factory
from . import io  # pycaffe's caffe.io: Transformer, load_image, resize_image, oversample
from .classifier import Classifier
from .detector import Detector
# pycaffe's _caffe utilities: glog set-up, Caffe's multi-GPU settings, Timer, NCCL (absent)
from .log import init_log
from . import log  # a callable module: caffe.log("text") logs an INFO line, as pycaffe's
from .common import (NCCL, has_nccl, set_multiprocess, set_solver_count, set_solver_rank,
                     solver_count, solver_rank)
from .benchmark import Timer


def layer_type_list() -> list[str]:
    """pycaffe's ``caffe.layer_type_list()``: the registered layer type names, sorted
    (python/caffe/_caffe.cpp binds LayerRegistry::LayerTypeList, which walks a std::map)."""
    return known_layer_types()


__version__ = "0.1.0"

__all__ = ["Net", "Blob", "Layer", "Solver", "SGDSolver", "NesterovSolver", "AdaGradSolver",
           "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "get_solver", "TRAIN", "TEST",
           "Classifier", "Detector", "io", "caffe_pb2", "set_mode_cpu", "set_mode_gpu", "set_device",
           "gpu_available", "register_layer", "known_layer_types", "layer_type_list", "set_random_seed", "layers",
           "params", "NetSpec", "to_proto", "init_log", "log", "has_nccl", "solver_count",
           "set_solver_count", "solver_rank", "set_solver_rank", "set_multiprocess", "NCCL",
           "Timer"]


def __getattr__(name):
    # NetSpec-style builder (pycaffe's caffe.NetSpec, caffe.layers as L, caffe.params as P),
    # imported lazily so that building nets does not pay for it.
    if name in ("NetSpec", "to_proto", "params"):
        from . import netspec
        return getattr(netspec, "P" if name == "params" else name)
    raise AttributeError(name)


def _answer_to_caffe():
    """Scripts and Python layers written for pycaffe say ``import caffe`` and ``from
    caffe.proto import caffe_pb2``.  Once minicaffe is imported, and where no real Caffe is
    installed, those names reach minicaffe (a real ``caffe`` package always wins)."""
    import importlib.util
    import sys
    if "caffe" in sys.modules:
        return
    try:
        if importlib.util.find_spec("caffe") is not None:
            return
    except (ImportError, ValueError):
        return
    from . import proto
    sys.modules["caffe"] = sys.modules[__name__]
    sys.modules["caffe.proto"] = proto
    sys.modules["caffe.proto.caffe_pb2"] = caffe_pb2
    sys.modules["caffe.io"] = io
    sys.meta_path.insert(0, _CaffeSubmodules())


class _CaffeSubmodules:
    """``import caffe.X`` (pycaffe's submodules: coord_map, net_spec, pycaffe, classifier...)
    gives minicaffe's module of that role, the same object as ``minicaffe.X`` (a second copy
    would have its own classes, and its exceptions would not be the ones minicaffe raises)."""
    RENAMED = {"caffe.net_spec": "minicaffe.netspec", "caffe.pycaffe": "minicaffe"}

    def _target(self, fullname):
        return self.RENAMED.get(fullname, "minicaffe" + fullname[len("caffe"):])

    def find_spec(self, fullname, path=None, target=None):
        import importlib.util
        if not fullname.startswith("caffe.") or fullname.count(".") != 1:
            return None
        try:
            if importlib.util.find_spec(self._target(fullname)) is None:
                return None
        except (ImportError, ValueError):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        import importlib
        return importlib.import_module(self._target(spec.name))

    def exec_module(self, module):
        """Nothing: the module is minicaffe's, executed when it was imported."""


_answer_to_caffe()
