"""Test helpers shipped with the package: the gradient checker and layer builders."""
from .gradient_check import check_gradient, numerical_gradients, make_layer, make_blob

__all__ = ["check_gradient", "numerical_gradients", "make_layer", "make_blob"]
