"""Never lie about memory: a seeded fuzz over random small nets.

For every net (random layers, random minibatch 1-8, float32) and every strategy the executor
runs (``none``, ``naive``, ``vdnn``, ``recompute``, ``resident``, ``dynamic`` with a random
set of pinned feature maps, random layers to recompute and a random prefetch lead), at budgets None, ``min_budget``, ``min_budget`` + 4 KiB and two
random larger ones, a plan is installed and trains 2 iterations with every fresh or released
region poisoned with NaN.  Checked:

(a) the arena's measured high-water mark is the plan's arena bytes and the bytes in use at the
    worst moment are its eq. (4) peak, exactly (as tests/swap/test_recompute.py compares them:
    no slack; the CPU executor has no scratch reserve and no transients);
(b) at ``min_budget`` the plan installs; 4 KiB below it ``install`` refuses before the first
    iteration with a BudgetError that names the smallest budget (for ``dynamic``, that of its
    recompute policy; without the prefetch lead, as its message says);
(c) the parameters (BatchNorm statistics included), solver history and losses equal those of
    a plain run with the same convolution lowering, bit for bit;
(d) ``minicaffe mem``'s table (swap.memory.memory_report) prints each strategy's unbounded
    plan's peak and arena as the executor's plan has them.
"""
import random

import pytest

from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing import sgd_solver, train_steps
from swap.memory import fmt_bytes, memory_report
from swap.plan import (BudgetError, dynamic_recompute, make_plan, min_budget,
                       recompute_candidates)
from swap.runtime import close_all, install, lowering_for

from test_recompute import DATA, LOSS, conv, ip, layer, pool, same  # tests/swap/

SEED = 20240611
N_NETS = 36
ITERS = 2
STRATEGIES = ("none", "naive", "vdnn", "recompute", "resident", "dynamic")


# ------------------------------------------------------------------ random nets
def random_net(rng: random.Random) -> tuple:
    """(prototxt text with BATCH, minibatch): a random chain of blocks over DummyData."""
    c, hw = rng.randint(1, 3), rng.randint(6, 10)
    text = f'name: "fuzz"' + DATA.format(c=c, hw=hw).replace("2.99", "3.99")
    top, n = "data", 0
    for _ in range(rng.randint(2, 5)):
        n += 1
        kind = rng.choice(("conv", "convbn", "residual", "concat", "pool", "dropout"))
        if kind == "pool" and hw < 4 or kind in ("residual", "dropout") and top == "data":
            kind = "conv"
        name = f"b{n}"
        if kind in ("conv", "convbn"):
            c = rng.randint(2, 6)
            k = rng.choice((1, 3))
            text += conv(name, top, c, k=k, pad=k // 2)
            if kind == "convbn":
                text += (layer(f"{name}_bn", "BatchNorm", name, name)
                         + layer(f"{name}_sc", "Scale", name, name,
                                 "scale_param { bias_term: true }"))
            if rng.random() < 0.7:
                text += layer(f"{name}_relu", "ReLU", name, name)
        elif kind == "residual":                # the input read twice: Caffe inserts a Split
            text += (conv(f"{name}_a", top, c) + layer(f"{name}_ar", "ReLU", f"{name}_a",
                                                       f"{name}_a")
                     + conv(f"{name}_b", f"{name}_a", c)
                     + f"""
layer {{ name: "{name}" type: "Eltwise" bottom: "{top}" bottom: "{name}_b" top: "{name}" }}"""
                     + layer(f"{name}_relu", "ReLU", name, name))
        elif kind == "concat":
            c1, c2 = rng.randint(1, 4), rng.randint(1, 4)
            text += (conv(f"{name}_x", top, c1, k=1, pad=0) + conv(f"{name}_y", top, c2)
                     + f"""
layer {{ name: "{name}" type: "Concat" bottom: "{name}_x" bottom: "{name}_y" top: "{name}" }}""")
            c = c1 + c2
        elif kind == "pool":
            text += pool(name, top, rng.choice(("MAX", "AVE")), k=2, s=2)
            hw //= 2
        else:                                   # Dropout, in place or not
            out = top if rng.random() < 0.5 else name
            text += layer(name, "Dropout", top, out)
            name = out
        top = name
    if rng.random() < 0.5:
        text += ip("fc1", top, rng.randint(3, 8)) + layer("fc1_relu", "ReLU", "fc1", "fc1")
        if rng.random() < 0.5:
            text += layer("fc1_drop", "Dropout", "fc1", "fc1")
        top = "fc1"
    text += ip("fc", top, 4) + LOSS
    return text, rng.randint(1, 8)


def cases():
    rng = random.Random(SEED)
    return [(i,) + random_net(rng) for i in range(N_NETS)]


def solver_of(text, batch):
    return sgd_solver(parse_text(text.replace("BATCH", str(batch)), caffe_pb2.NetParameter))


def run(text, batch, strategy, budget=None, pinned=frozenset(), **options):
    return train_steps(solver_of(text, batch), ITERS, strategy, budget, pinned=pinned,
                       **options)


# ------------------------------------------------------------------ the fuzz
@pytest.mark.parametrize("i,text,batch", cases(), ids=lambda v: v if isinstance(v, int) else "")
def test_predicted_memory_is_what_the_executor_uses(i, text, batch):
    rng = random.Random(SEED * 1000 + i)
    refs = {}                               # lowering -> plain run
    unbounded = {}                          # strategy -> the executor's unbounded plan
    try:
        for strategy in STRATEGIES:
            lowering = lowering_for(strategy)
            if lowering not in refs:
                refs[lowering] = train_steps(solver_of(text, batch), ITERS, None, None,
                                             lowering, poison=False)
            ref = refs[lowering]
            # the GMAP install builds (its lowering and BatchNorm+Scale fusion): pins are its
            # buffer ids, min_budget is asked of it
            *_, ex0 = run(text, batch, strategy)
            g = ex0.gmap
            unbounded[strategy] = ex0.plan
            pinned, options, rec, lead = frozenset(), {}, [], 0
            if strategy == "dynamic":
                fm = list(g.feature_maps())
                pinned = frozenset(rng.sample(fm, rng.randint(0, len(fm))))
                names = [c[0] for c in recompute_candidates(g, pinned=pinned)]
                rec = rng.sample(names, rng.randint(0, len(names)))
                lead = rng.choice((0, 0, 1, 2))
                options = {"recompute": rec, "lead": lead}
            policy = dynamic_recompute(g, rec, pinned) if rec else None
            plan_options = {"recompute": policy} if policy else {}
            need = make_plan(g, strategy, None, pinned, **plan_options,
                             **({"lead": lead} if lead else {})).arena_bytes
            # what the error names: the plan with its recomputations, without a prefetch lead
            # (documented in its message: "laid out with ... no prefetch lead")
            named = make_plan(g, strategy, None, pinned, **plan_options).arena_bytes
            if not (rec or lead):
                assert need == named == min_budget(g, strategy, pinned)
            what = (f"net {i} k={batch} {strategy} pinned={len(pinned)} recompute={rec} "
                    f"lead={lead}")
            # (b) a few KiB below the smallest budget: refused before the first iteration
            s = solver_of(text, batch)
            with pytest.raises(BudgetError) as e:
                install(s, strategy, need - 4096, pinned=pinned, **options)
            assert e.value.min_budget == named, what
            assert f"({named} bytes)" in str(e.value) and "too small" in str(e.value), what
            assert s.net.executor is None and s.iter == 0, what
            budgets = [None, need, need + 4096] + [need + rng.randint(1, 4 * need)
                                                    for _ in range(2)]
            for budget in budgets:
                params, history, losses, ex = run(text, batch, strategy, budget, pinned,
                                                  **options)
                if strategy == "dynamic":
                    assert ex.plan.lead == lead, what
                    assert ex.plan.recomputed == (policy.recomputed if policy else set()), what
                plan = ex.plan
                # (a) the model's figures are the measured ones
                assert ex.high_water == plan.arena_bytes, (what, budget)
                assert ex.peak_in_use == plan.peak == plan.check(), (what, budget)
                if budget is not None:
                    assert plan.arena_bytes <= budget == ex.device.capacity, (what, budget)
                if budget == need:
                    assert plan.arena_bytes == need, what
                # (c) swapping does not change the arithmetic
                assert same(params, ref[0]), (what, budget)
                assert same(history, ref[1]), (what, budget)
                assert losses == ref[2], (what, budget)
        # (d) `minicaffe mem` prints the executor's unbounded plans
        report = memory_report(ex0.gmap, strategies=("none", "naive", "vdnn", "recompute"))
        rows = {line.split()[0]: line.split() for line in report.splitlines()[2:-1]}
        for strategy in ("none", "naive", "vdnn", "recompute"):
            plan = unbounded[strategy]
            row = " ".join(rows[strategy])
            assert f"{fmt_bytes(plan.peak)} {fmt_bytes(plan.arena_bytes)}" in row, (
                i, strategy, row, plan.peak, plan.arena_bytes)
            assert make_plan(ex0.gmap.caffe_lowering() if strategy == "none" else ex0.gmap,
                             strategy).arena_bytes == plan.arena_bytes, (i, strategy)
    finally:
        close_all()
