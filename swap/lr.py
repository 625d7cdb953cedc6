"""The learning rate for the efficiency-optimal minibatch (paper, section 4.2, eq. 8-9).

Training for a fixed number of epochs with a minibatch q = k* / k_base times larger makes q times
fewer updates.  The paper keeps the convergence rate of SGD with a fixed step (Bottou, Curtis and
Nocedal 2018, theorem 4.6) by equating the contraction factors (eq. 8):

    (1 - alpha_base c mu)^(iters_base - 1) = (1 - alpha* c mu)^(iters_base / q - 1)

With mu ~= 1 (a large minibatch's gradient is close to unbiased) and many iterations this gives
(eq. 9)

    alpha* ~= (1 - (1 - alpha_base c)^q) / c

c is the convexity constant of the objective, unknown for a deep net.  **Default c = 1**: then
``alpha* = 1 - (1 - alpha_base)^q``, which for the paper's own setting reproduces its choice
within 2%: ResNet-101 with the usual alpha_base = 0.1 at k_base = 256 (He et al.) and a total
minibatch of 592 (table 2: 8 x 74) gives q = 2.3125 and alpha* = 0.216; the paper trained with 0.22
and reached 76.2% top-1.  ``--convexity`` overrides it; eq. (9) needs ``0 < alpha_base c < 1``.

Two common rules for comparison: ``linear`` (alpha_base q, Goyal et al. 2017) and ``sqrt``
(alpha_base sqrt(q), Krizhevsky 2014).  For q -> 1 all three give alpha_base; for small alpha c
eq. (9) ~= alpha_base q (the linear rule); for large q it saturates at 1 / c.
"""
from __future__ import annotations

import math

LR_RULES = ("eq9", "linear", "sqrt")
DEFAULT_CONVEXITY = 1.0


def eq9(alpha_base: float, q: float, c: float = DEFAULT_CONVEXITY) -> float:
    """eq. (9): ``(1 - (1 - alpha_base c)^q) / c``."""
    if c <= 0:
        raise ValueError(f"the convexity constant must be positive, got {c}")
    if not 0 < alpha_base * c < 1:
        raise ValueError(f"eq. (9) needs 0 < alpha_base * c < 1 (the contraction factor "
                         f"1 - alpha c must lie in (0, 1)); got alpha_base {alpha_base} and c {c}: "
                         "give a smaller --convexity")
    if q <= 0:
        raise ValueError(f"q = k*/k_base must be positive, got {q}")
    return (1.0 - (1.0 - alpha_base * c) ** q) / c


def scale_lr(alpha_base: float, k_star: int, k_base: int, rule: str = "eq9",
             convexity: float = DEFAULT_CONVEXITY) -> float:
    """The learning rate for minibatch ``k_star`` given ``alpha_base`` at ``k_base``.

    rule: ``eq9`` (the paper), ``linear`` or ``sqrt``; convexity: c of eq. (9).
    """
    if k_star <= 0 or k_base <= 0:
        raise ValueError(f"minibatch sizes must be positive, got k* = {k_star}, k_base = {k_base}")
    q = k_star / k_base
    if rule == "eq9":
        return eq9(alpha_base, q, convexity)
    if rule == "linear":
        return alpha_base * q
    if rule == "sqrt":
        return alpha_base * math.sqrt(q)
    raise ValueError(f"unknown learning-rate rule {rule!r} (known: {', '.join(LR_RULES)})")


__all__ = ["LR_RULES", "DEFAULT_CONVEXITY", "eq9", "scale_lr"]
