"""Every layer family lives in one module here; importing the package
registers all of them with :mod:`minicaffe.layer`'s registry."""
import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")


def __getattr__(name):
    # pycaffe's ``from caffe import layers as L``: this package holds the layer
    # implementations, and a Caffe type name that is not one of its attributes
    # (``L.Convolution``) is a NetSpec layer factory. Type names are CamelCase,
    # module and private names are not, so those still raise AttributeError.
    if name[:1].isupper():
        from ..netspec import L
        return getattr(L, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
