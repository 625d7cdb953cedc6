"""Test helpers shipped with the package: the gradient checker, layer builders and small
training runs."""
from .gradient_check import check_gradient, numerical_gradients, make_layer, make_blob
from .training import sgd_solver, train_steps

__all__ = ["check_gradient", "numerical_gradients", "make_layer", "make_blob", "sgd_solver",
           "train_steps"]
