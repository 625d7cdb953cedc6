"""A seeded fuzz of the six solvers against a reference written from BVLC Caffe's C++ source.

Each case draws, from its own seed, a solver (type, lr_policy and its fields, momentum,
momentum2, rms_decay, delta, weight_decay, regularization_type, sometimes clip_gradients,
iter_size 1-3, a start iteration, 3-6 iterations in one or two ``step`` calls, display and
average_loss), a loss (EuclideanLoss or SoftmaxWithLoss) and each parameter's ParamSpec
(lr_mult and decay_mult absent, 0 or not, one weight shared by name between two layers).
minicaffe trains the float64 net through the Python API (a solver prototxt text, then
``solver.step``); the reference starts from the same initial weights, reads the batches that
the DummyData layer drew, computes the gradients itself, and updates as Caffe does.  After
every iteration the accumulated gradients, the loss, the smoothed loss, the weights, every
history blob and current_step are compared, to 1e-12 of each array's scale.

The reference, op for op as Caffe runs them for Dtype = double:

- src/caffe/solver.cpp, Solver::Step: ClearParamDiffs; ``iter_size`` ForwardBackward passes
  whose param diffs accumulate, loss = their sum / iter_size; UpdateSmoothedLoss (losses_
  cleared and smoothed_loss_ = 0 at each Step call); ApplyUpdate; ++iter_.
- src/caffe/solvers/sgd_solver.cpp: GetLearningRate for every policy (``inv`` multiplies
  ``param_.gamma() * iter_`` in float: a float field times an int); ApplyUpdate:
  ClipGradients (the L2 norm of all learnable diffs, scaled only when above clip_gradients,
  before Normalize, so on the iter_size sum), then per learnable param Normalize (diff *=
  1 / iter_size, only when iter_size != 1), Regularize (local_decay = weight_decay *
  decay_mult; L2 adds local_decay * data, L1 local_decay * sign(data), nothing when
  local_decay is 0), ComputeUpdateValue; then Net::Update (data -= diff, owners only).
- ComputeUpdateValue of sgd_solver.cpp (axpby: history = momentum * history + local_rate *
  diff), nesterov_solver.cpp, adagrad_solver.cpp, rmsprop_solver.cpp, adadelta_solver.cpp
  and adam_solver.cpp; ``history_`` holds one blob per learnable param, then (AdaDelta,
  Adam) a second run of them (AdaDeltaPreSolve, AdamPreSolve).
- src/caffe/net.cpp, Net::Init and AppendParam: a layer's param gets a diff when its own
  ParamSpec's lr_mult (1 when absent) is not 0; a param named again shares data and diff
  with its owner, and the learnable param's lr_mult (decay_mult) is the first one given
  explicitly by the owner or a sharer, 1 when none.
"""
import math

import numpy as np
import pytest

from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver
from test_caffe_spec_solver import f32          # a float proto field's value

SEED = 20240611
N_CASES = 80
TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
BATCH, D_IN, HIDDEN, D_OUT = 5, 4, 5, 3
FLT_MIN = float(np.finfo(np.float32).tiny)
RTOL = 1e-12

# (layer, param index) of every param, in the order Net::AppendParam sees them; ip3's weight
# shares ip2's by the name "shared"
PARAMS = [("ip1", 0), ("ip1", 1), ("ip2", 0), ("ip2", 1), ("ip3", 0), ("ip3", 1), ("ip4", 0),
          ("ip4", 1)]
# the learnable (owner) params, Caffe's learnable_params_ order: W1 b1 Ws b2 b3 W4 b4
LEARNABLE = [("ip1", 0), ("ip1", 1), ("ip2", 0), ("ip2", 1), ("ip3", 1), ("ip4", 0), ("ip4", 1)]
OWNER = {p: LEARNABLE.index(p) for p in LEARNABLE}
OWNER[("ip3", 0)] = LEARNABLE.index(("ip2", 0))


# ------------------------------------------------------------------------------ the cases
def _spec_values(rng, shared_with=None):
    """(lr_mult, decay_mult), each None (absent) or a value; a sharer of ``shared_with``
    gives a value only where Net::AppendParam accepts it (the owner's, or any when the owner
    gave none)."""
    out = []
    for choices, owner in zip(([0.0, 0.5, 1.0, 2.0], [0.0, 1.0, 2.5]),
                              shared_with or (None, None)):
        if rng.random() < 0.35:
            out.append(None)
        elif shared_with is not None and owner is not None:
            out.append(owner)
        else:
            out.append(float(rng.choice(choices)))
    return tuple(out)


def make_case(i):
    """Case ``i``: the solver type and lr policy cycle (every pair within 42 cases), the rest
    is drawn from seed SEED + i."""
    rng = np.random.default_rng(SEED + i)
    kind, policy = TYPES[i % len(TYPES)], POLICIES[i % len(POLICIES)]
    u = rng.random()
    # iter_ past 2^24: an int that a float cannot hold (inv's gamma() * iter_ rounds it)
    start = 0 if u < 0.4 else int(rng.integers(1, 2000)) if u < 0.9 else \
        int(rng.integers(1 << 24, 1 << 25)) | 1
    iters = int(rng.integers(3, 7))
    end = start + iters
    f = {"type": kind, "lr_policy": policy, "iter_size": int(rng.integers(1, 4)),
         "display": int(rng.choice([0, 1, 2])), "average_loss": int(rng.integers(1, 5))}
    if kind in ("SGD", "Nesterov"):
        f["base_lr"] = float(np.exp(rng.uniform(np.log(1e-3), np.log(0.1))))
        if rng.random() < 0.8:
            f["momentum"] = float(rng.uniform(0.5, 0.95))
    elif kind == "AdaDelta":
        f["base_lr"] = float(rng.uniform(0.1, 1.0))
        if rng.random() < 0.85:         # else 0, which AdaDelta (unlike AdaGrad) accepts
            f["momentum"] = float(rng.uniform(0.8, 0.99))
    elif kind == "Adam":
        f["base_lr"] = float(np.exp(rng.uniform(np.log(1e-3), np.log(0.05))))
        if rng.random() < 0.85:          # else beta1 = 0
            f["momentum"] = float(rng.uniform(0.8, 0.95))
        if rng.random() < 0.5:
            f["momentum2"] = float(rng.uniform(0.9, 0.9999))
    else:
        f["base_lr"] = float(np.exp(rng.uniform(np.log(1e-3), np.log(0.05))))
        if rng.random() < 0.3:
            f["momentum"] = 0.0            # AdaGrad, RMSProp: Caffe CHECKs momentum == 0
    if kind == "RMSProp" and rng.random() < 0.6:
        f["rms_decay"] = float(rng.uniform(0.5, 0.99))
    if kind != "SGD" and kind != "Nesterov" and rng.random() < 0.6:
        f["delta"] = float(rng.choice([1e-8, 1e-6, 1e-4, 1e-2]))
    if rng.random() < 0.75:
        f["weight_decay"] = float(np.exp(rng.uniform(np.log(1e-4), np.log(5e-2))))
    reg = str(rng.choice(["", "L2", "L1"]))
    if "weight_decay" not in f and rng.random() < 0.3:
        reg = "elastic"     # Regularize reads the type only where local_decay != 0
    if reg:
        f["regularization_type"] = str(reg)
    u = rng.random()
    if u < 0.05:
        f["clip_gradients"] = 0.0
    elif u < 0.5:
        f["clip_gradients"] = float(np.exp(rng.uniform(np.log(0.05), np.log(5.0))))
    stepvalue = []
    if policy == "step":
        f["gamma"] = float(rng.uniform(0.1, 0.9))
        f["stepsize"] = int(rng.integers(1, 4)) if start < 8 else \
            int(rng.integers(max(1, start // 8), start + 1))
    elif policy == "exp":
        f["gamma"] = float(1 - rng.uniform(0, 3.0 / (start + 10)))
    elif policy == "inv":
        f["gamma"] = float(np.exp(rng.uniform(np.log(1e-4), np.log(0.1))))
        f["power"] = float(rng.uniform(0.5, 1.0))
    elif policy == "multistep":
        f["gamma"] = float(rng.uniform(0.1, 0.9))
        # values before the start too: current_step_ catches up one step per iteration
        stepvalue = sorted(set(int(v) for v in rng.integers(0, end + 2,
                                                            size=int(rng.integers(1, 5)))))
    elif policy == "poly":
        f["power"] = float(rng.uniform(0.5, 3.0))
        f["max_iter"] = end + int(rng.integers(1, 50))
    elif policy == "sigmoid":
        f["gamma"] = float(rng.choice([-1, 1]) * rng.uniform(0.01, 1.0))
        f["stepsize"] = int(rng.integers(1, end + 5))
    specs = {}
    for layer, pi in PARAMS:
        if (layer, pi) == ("ip3", 0):
            specs[layer, pi] = _spec_values(rng, shared_with=specs["ip2", 0])
        else:
            specs[layer, pi] = _spec_values(rng)
    split = int(rng.integers(1, iters)) if rng.random() < 0.5 else iters
    loss = str(rng.choice(["EuclideanLoss", "SoftmaxWithLoss"]))
    return dict(i=i, fields=f, stepvalue=stepvalue, start=start, iters=iters, split=split,
                specs=specs, loss=loss)


CASES = [make_case(i) for i in range(N_CASES)]


def case_id(c):
    f = c["fields"]
    tags = [f"{c['i']:02d}", f["type"], f["lr_policy"], f.get("regularization_type", "")]
    if "clip_gradients" in f:
        tags.append("clip")
    tags.append(f"is{f['iter_size']}")
    return "-".join(t for t in tags if t)


# ---------------------------------------------------------------------------- minicaffe
def _param_text(spec, name=""):
    lr, decay = spec
    body = (f'name: "{name}" ' if name else "") + (f"lr_mult: {lr} " if lr is not None else "") \
        + (f"decay_mult: {decay} " if decay is not None else "")
    return f"param {{ {body}}}"


def net_text(case):
    specs, loss = case["specs"], case["loss"]
    if loss == "EuclideanLoss":
        target = f"shape {{ dim: {BATCH} dim: {D_OUT} }}"
        filler = 'data_filler { type: "gaussian" std: 1 }'
    else:   # labels 0..D_OUT-1 after SoftmaxWithLoss's static_cast<int>
        target = f"shape {{ dim: {BATCH} }}"
        filler = f'data_filler {{ type: "uniform" min: 0 max: {D_OUT - 0.001} }}'

    def ip(name, bottom, top, n):
        w = _param_text(specs[name, 0], "shared" if name in ("ip2", "ip3") else "")
        return (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{top}" '
                f"{w} {_param_text(specs[name, 1])} inner_product_param {{ num_output: {n} "
                'weight_filler { type: "gaussian" std: 0.5 } '
                'bias_filler { type: "gaussian" std: 0.2 } } }')
    return "\n".join([
        'name: "fuzz"',
        'layer { name: "data" type: "DummyData" top: "data" top: "target" dummy_data_param { '
        f'shape {{ dim: {BATCH} dim: {D_IN} }} {target} '
        f'data_filler {{ type: "gaussian" std: 1 }} {filler} }} }}',
        ip("ip1", "data", "h1", HIDDEN),
        'layer { name: "relu1" type: "ReLU" bottom: "h1" top: "h1" }',
        ip("ip2", "h1", "h2", HIDDEN),
        'layer { name: "relu2" type: "ReLU" bottom: "h2" top: "h2" }',
        ip("ip3", "h2", "h3", HIDDEN),
        ip("ip4", "h3", "out", D_OUT),
        f'layer {{ name: "loss" type: "{loss}" bottom: "out" bottom: "target" top: "loss" }}',
    ])


def solver_text(case):
    lines = [f'{k}: "{v}"' if isinstance(v, str) else f"{k}: {v}"
             for k, v in case["fields"].items()]
    lines += [f"stepvalue: {v}" for v in case["stepvalue"]]
    lines += [f"random_seed: {1000 + case['i']}", "solver_mode: CPU"]
    lines.append("net_param { " + net_text(case) + " }")
    return "\n".join(lines)


def run_minicaffe(case):
    """Train the case with minicaffe; returns the solver, its initial weights and, per
    iteration: the batches drawn, the accumulated raw gradients, the loss, the smoothed loss
    (display iterations), and after the update the weights, the history blobs and
    current_step."""
    sp = parse_text(solver_text(case), caffe_pb2.SolverParameter)
    s = Solver(sp, verbose=False, dtype=np.float64)
    net = s.net
    blobs = [net.params[layer][pi] for layer, pi in LEARNABLE]
    assert [id(b) for b in net.learnable_params] == [id(b) for b in blobs]
    assert np.shares_memory(net.params["ip3"][0].data, net.params["ip2"][0].data)   # shared
    s.iter = case["start"]      # as a restored state would set it: the rates at any iteration
    init = [b.data.copy() for b in blobs]
    rec = {"batches": [], "grads": [], "loss": [], "smoothed": [], "after": []}
    fb = net.forward_backward

    def forward_backward():
        loss = fb()
        rec["batches"][-1].append((net.blobs["data"].data.copy(),
                                   net.blobs["target"].data.copy()))
        return loss
    net.forward_backward = forward_backward

    def after_previous():
        return ([b.data.copy() for b in blobs], [h.copy() for h in s.rule.state_blobs()],
                s.current_step)

    def on_start():
        if len(rec["after"]) < len(rec["grads"]):     # the iteration before, updated
            rec["after"].append(after_previous())
        rec["batches"].append([])

    def on_gradients_ready():
        rec["grads"].append([b.diff.copy() for b in blobs])
        rec["loss"].append(float(s.last_loss))
        display = s.param.display and s.iter % s.param.display == 0
        rec["smoothed"].append(s.smoothed_loss if display else None)
    s.add_callback(on_start, on_gradients_ready)
    diffs = []
    for n in (case["split"], case["iters"] - case["split"]):
        if n:
            s.step(n)
            rec["after"].append(after_previous())
            diffs.append((len(rec["after"]) - 1, [b.diff.copy() for b in blobs]))
    assert s.iter == case["start"] + case["iters"]
    assert len(rec["after"]) == len(rec["grads"]) == case["iters"]
    return s, init, rec, diffs


# ---------------------------------------------------------------------------- reference
def get_learning_rate(sp, it, current_step):
    """SGDSolver::GetLearningRate with Dtype = double: (rate, current_step_)."""
    policy, base = sp.lr_policy, sp.base_lr
    if policy == "fixed":
        return base, current_step
    if policy == "step":
        current_step = it // sp.stepsize            # iter_ / stepsize, ints
        return base * math.pow(sp.gamma, current_step), current_step
    if policy == "exp":
        return base * math.pow(sp.gamma, it), current_step
    if policy == "inv":
        # Dtype(1) + this->param_.gamma() * this->iter_: float() * int is a float product
        prod = float(np.float32(sp.gamma) * np.float32(it))
        return base * math.pow(1.0 + prod, -sp.power), current_step
    if policy == "multistep":
        if current_step < len(sp.stepvalue) and it >= sp.stepvalue[current_step]:
            current_step += 1
        return base * math.pow(sp.gamma, current_step), current_step
    if policy == "poly":
        return base * math.pow(1.0 - float(it) / float(sp.max_iter), sp.power), current_step
    if policy == "sigmoid":
        with np.errstate(over="ignore"):         # C's exp overflows to inf: the rate is 0
            e = float(np.exp(-sp.gamma * (float(it) - float(sp.stepsize))))
        return base * (1.0 / (1.0 + e)), current_step
    raise AssertionError(policy)


class CaffeReference:
    """The fuzz net (ip1 relu ip2 relu ip3 ip4 loss, ip2 and ip3 sharing their weight) and
    Caffe's SGDSolver family over it, float64."""

    def __init__(self, sp, case, init):
        self.sp, self.loss_type = sp, case["loss"]
        self.params = [w.copy() for w in init]       # W1 b1 Ws b2 b3 W4 b4
        n = len(self.params)
        # Net::Init: param_propagate_down from each layer's own spec (lr_mult 1 when absent)
        self.propagate = {p: (case["specs"][p][0] if case["specs"][p][0] is not None else 1.0)
                          != 0 for p in PARAMS}
        # Net::AppendParam: the first explicit lr_mult / decay_mult, owner then sharer
        self.lr_mult, self.decay_mult = [1.0] * n, [1.0] * n
        for j, values in ((0, self.lr_mult), (1, self.decay_mult)):
            given = [False] * n
            for p in PARAMS:
                v = case["specs"][p][j]
                if v is not None and not given[OWNER[p]]:
                    given[OWNER[p]] = True
                    values[OWNER[p]] = f32(v)
        # SGDSolver::PreSolve, AdaDeltaPreSolve, AdamPreSolve
        slots = 2 if sp.type in ("AdaDelta", "Adam") else 1
        self.history = [np.zeros_like(w) for _ in range(slots) for w in self.params]
        self.iter, self.current_step = case["start"], 0
        self.losses, self.smoothed_loss, self.start_iter = [], 0.0, self.iter

    # ---------------------------------------------------------------- net
    def forward_backward(self, x, target, diffs):
        """One ForwardBackward: the loss; each param's gradient added to ``diffs`` (Caffe's
        accumulating param diffs), in backward order (ip3's share of Ws before ip2's)."""
        W1, b1, Ws, b2, b3, W4, b4 = self.params
        a1 = np.maximum(x @ W1.T + b1, 0)
        a2 = np.maximum(a1 @ Ws.T + b2, 0)
        h3 = a2 @ Ws.T + b3
        out = h3 @ W4.T + b4
        if self.loss_type == "EuclideanLoss":     # dot(d, d) / num / 2; diff d / num
            d = out - target
            loss = float(np.dot(d.ravel(), d.ravel())) / BATCH / 2
            dout = d / BATCH
        else:    # -sum(log(max(p[label], FLT_MIN))) / valid count; (p - onehot) / count
            label = target.astype(np.int64)       # static_cast<int>
            e = np.exp(out - out.max(axis=1, keepdims=True))
            prob = e / e.sum(axis=1, keepdims=True)
            p = prob[np.arange(BATCH), label]
            loss = -float(np.log(np.maximum(p, FLT_MIN)).sum()) / BATCH
            dout = prob.copy()
            dout[np.arange(BATCH), label] -= 1
            dout /= BATCH
        prop = self.propagate
        if prop["ip4", 0]:
            diffs[5] += dout.T @ h3
        if prop["ip4", 1]:
            diffs[6] += dout.sum(axis=0)
        dh3 = dout @ W4
        if prop["ip3", 0]:
            diffs[2] += dh3.T @ a2
        if prop["ip3", 1]:
            diffs[4] += dh3.sum(axis=0)
        dh2 = (dh3 @ Ws) * (a2 > 0)
        if prop["ip2", 0]:
            diffs[2] += dh2.T @ a1
        if prop["ip2", 1]:
            diffs[3] += dh2.sum(axis=0)
        dh1 = (dh2 @ Ws) * (a1 > 0)
        if prop["ip1", 0]:
            diffs[0] += dh1.T @ x
        if prop["ip1", 1]:
            diffs[1] += dh1.sum(axis=0)
        return loss

    # ---------------------------------------------------------------- Solver::Step
    def begin_step(self):
        """Step's start: losses_.clear(); smoothed_loss_ = 0; start_iter = iter_."""
        self.losses, self.smoothed_loss, self.start_iter = [], 0.0, self.iter

    def iteration(self, batches):
        diffs = [np.zeros_like(w) for w in self.params]      # ClearParamDiffs
        loss = 0.0
        for x, target in batches:
            loss += self.forward_backward(x, target, diffs)
        loss /= self.sp.iter_size
        self.update_smoothed_loss(loss)
        grads = [d.copy() for d in diffs]
        self.apply_update(diffs)
        self.iter += 1
        return loss, grads

    def update_smoothed_loss(self, loss):
        """Solver::UpdateSmoothedLoss."""
        average_loss = self.sp.average_loss
        if len(self.losses) < average_loss:
            self.losses.append(loss)
            size = len(self.losses)
            self.smoothed_loss = (self.smoothed_loss * (size - 1) + loss) / size
        else:
            idx = (self.iter - self.start_iter) % average_loss
            self.smoothed_loss += (loss - self.losses[idx]) / average_loss
            self.losses[idx] = loss

    # ---------------------------------------------------------------- SGDSolver
    def apply_update(self, diffs):
        sp = self.sp
        rate, self.current_step = get_learning_rate(sp, self.iter, self.current_step)
        # ClipGradients
        if sp.clip_gradients >= 0:
            sumsq = sum(float(np.dot(d.ravel(), d.ravel())) for d in diffs)
            l2norm = math.sqrt(sumsq)
            if l2norm > sp.clip_gradients:
                scale = sp.clip_gradients / l2norm
                for d in diffs:
                    d *= scale
        for i, (w, d) in enumerate(zip(self.params, diffs)):
            if sp.iter_size != 1:                                   # Normalize
                d *= 1.0 / sp.iter_size
            local_decay = sp.weight_decay * self.decay_mult[i]      # Regularize
            if local_decay:
                if sp.regularization_type == "L2":
                    d += local_decay * w
                elif sp.regularization_type == "L1":
                    d += local_decay * np.sign(w)
                else:
                    raise AssertionError(sp.regularization_type)
            self.compute_update_value(i, d, rate * self.lr_mult[i])
        for w, d in zip(self.params, diffs):                          # Net::Update
            w -= d
        self.diffs = diffs

    def compute_update_value(self, i, d, local_rate):
        sp, n = self.sp, len(self.params)
        h = self.history[i]

        def axpby(alpha, x, beta, y):      # caffe_cpu_axpby: y = beta * y; y += alpha * x
            y *= beta
            y += alpha * x
        if sp.type == "SGD":
            axpby(local_rate, d, sp.momentum, h)
            d[...] = h
        elif sp.type == "Nesterov":
            update = h.copy()
            axpby(local_rate, d, sp.momentum, h)
            axpby(1 + sp.momentum, h, -sp.momentum, update)
            d[...] = update
        elif sp.type in ("AdaGrad", "RMSProp"):
            update = d ** 2
            if sp.type == "AdaGrad":
                h += update
            else:
                axpby(1 - sp.rms_decay, update, sp.rms_decay, h)
            update = np.sqrt(h)                       # caffe_powx(h, 0.5)
            update += sp.delta
            update = d / update
            d[...] = local_rate * update              # axpby(local_rate, update, 0, diff)
        elif sp.type == "AdaDelta":
            u = self.history[n + i]
            m, delta = sp.momentum, sp.delta
            update = d ** 2
            axpby(1 - m, update, m, h)
            temp = np.full_like(d, delta)
            update = temp + u
            temp = temp + h
            update = np.sqrt(update / temp)
            d *= update
            update = d ** 2
            axpby(1 - m, update, m, u)
            d *= local_rate                           # caffe_cpu_scale(local_rate, diff)
        elif sp.type == "Adam":
            v = self.history[n + i]
            b1, b2 = sp.momentum, sp.momentum2
            t = self.iter + 1
            correction = math.sqrt(1 - math.pow(b2, t)) / (1 - math.pow(b1, t))
            axpby(1 - b1, d, b1, h)
            axpby(1 - b2, d * d, b2, v)
            val_t = h / (np.sqrt(v) + sp.delta)
            d[...] = (local_rate * correction) * val_t
        else:
            raise AssertionError(sp.type)


# -------------------------------------------------------------------------------- tests
def assert_close(got, want, what):
    """Equal to RTOL of the array's scale (the largest magnitude of the reference's values):
    elementwise relative error is no measure where an element cancels to near 0."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    scale = float(np.abs(want).max()) if want.size else 0.0
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert err <= RTOL * scale or (scale == 0 and err == 0), \
        f"{what}: max |minicaffe - caffe| = {err:.3g}, scale {scale:.3g} " \
        f"(relative {err / scale if scale else math.inf:.3g})"


def test_the_cases_cover_every_solver_and_lr_policy_pair():
    pairs = {(c["fields"]["type"], c["fields"]["lr_policy"]) for c in CASES}
    assert len(pairs) == len(TYPES) * len(POLICIES)
    assert len({case_id(c) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_solver_matches_caffe(case):
    s, init, rec, diffs = run_minicaffe(case)
    ref = CaffeReference(s.param, case, init)
    names = [f"{layer}[{pi}]" for layer, pi in LEARNABLE]
    assert [f32(v) for v in s.net.param_lr_mult] == ref.lr_mult
    assert [f32(v) for v in s.net.param_decay_mult] == ref.decay_mult
    diff_at = dict(diffs)
    for k in range(case["iters"]):
        if k in (0, case["split"]):
            ref.begin_step()
        it = ref.iter
        assert len(rec["batches"][k]) == s.param.iter_size
        loss, grads = ref.iteration(rec["batches"][k])
        where = f"iteration {it}"
        for name, g, want in zip(names, rec["grads"][k], grads):
            assert_close(g, want, f"{where}: accumulated gradient of {name}")
        assert rec["loss"][k] == pytest.approx(loss, rel=RTOL, abs=0), f"{where}: loss"
        if rec["smoothed"][k] is not None:
            assert rec["smoothed"][k] == pytest.approx(ref.smoothed_loss, rel=RTOL, abs=0), \
                f"{where}: smoothed loss"
        weights, history, current_step = rec["after"][k]
        assert current_step == ref.current_step, f"{where}: current_step"
        for name, w, want in zip(names, weights, ref.params):
            assert_close(w, want, f"{where}: {name} after the update")
        assert len(history) == len(ref.history)
        for j, (h, want) in enumerate(zip(history, ref.history)):
            assert_close(h, want, f"{where}: history blob {j} ({names[j % len(names)]})")
        if k in diff_at:    # the applied update, left in the diffs by ApplyUpdate
            for name, d, want in zip(names, diff_at[k], ref.diffs):
                assert_close(d, want, f"{where}: {name}'s diff after the update")


@pytest.mark.parametrize("it", [3, 1000, (1 << 24) + 1])
def test_inv_rate_multiplies_gamma_by_iter_in_float(it):
    """The fuzz's one disagreement (cases 03, 17, 31, 38, 45, 52, 66, 73 failed before the
    fix): sgd_solver.cpp's ``pow(Dtype(1) + this->param_.gamma() * this->iter_,
    -this->param_.power())`` multiplies a float field by an int in float (past 2^24 the
    int itself rounds to a float); minicaffe multiplied in double."""
    from minicaffe.solver import learning_rate
    p = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="inv", gamma=1e-4, power=0.75)
    prod = np.float32(p.gamma) * np.float32(it)
    assert prod.dtype == np.float32
    assert learning_rate(p, it) == p.base_lr * (1.0 + float(prod)) ** -p.power
    assert learning_rate(p, it) != p.base_lr * (1.0 + p.gamma * it) ** -p.power
