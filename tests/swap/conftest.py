"""The swap tests' fixtures; the nets and helpers live in swap_nets.py.

Test modules import helpers from ``swap_nets``, never from ``conftest``: with several
test folders in one pytest run, the name ``conftest`` is another folder's module.
"""
from swap_nets import build_net, make_solver, net_file  # noqa: F401  (fixtures)
