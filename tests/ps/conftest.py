"""The parameter-server tests' fixtures; the helpers live in ps_helpers.py.

Test modules import helpers from ``ps_helpers``, never from ``conftest``: with several
test folders in one pytest run, the name ``conftest`` is another folder's module.
"""
from ps_helpers import procs  # noqa: F401  (a fixture)
