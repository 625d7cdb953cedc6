"""A ZeroMQ parameter server for bulk-synchronous data-parallel training (docs/PS.md).

Layers by responsibility, as in ps-lite:

* :mod:`ps.protocol`  the wire format: a fixed, validated header plus raw buffers
* :mod:`ps.transport` ZeroMQ sockets with bounded waits, CURVE, link emulation
* :mod:`ps.sharding`  which shard holds which parameter blob
* :mod:`ps.update`    a shard's SGD update, by minicaffe's own Solver code
* :mod:`ps.server`    one shard: join, BSP rounds, snapshots, failure reports
* :mod:`ps.worker`    a Solver whose update step pushes gradients and pulls parameters
* :mod:`ps.overlap`   when a group of gradients is final in backward, so that
                      communication overlaps the rest of the backward pass
* :mod:`ps.nccl`      the NCCL all-reduce alternative for the GPUs of one host
* :mod:`ps.cli`       ``minicaffe ps server|keys`` and the data-parallel ``train`` options

Only the light modules are imported here; ZeroMQ loads with the server or worker.
"""
import os


def env_count(var: str) -> int | None:
    """The whole number of at least 1 in ``$var``; None where it is unset or empty.  Anything
    else raises, naming the variable."""
    v = os.environ.get(var, "").strip()
    if not v:
        return None
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"${var}={v!r}: give a whole number") from None
    if n < 1:
        raise ValueError(f"${var}={v!r}: give at least 1")
    return n
