"""swap.profiler: resizing a net's minibatch in place, profiling real training iterations, JSON
profiles."""
import json

import numpy as np
import pytest

from minicaffe.net import TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text
from swap.gmap import build_gmap, net_batch_size
from swap.model import ComputeModel, PCIeModel, ThroughputCurve
from swap.plan import min_budget
from swap.profiler import (SCHEMA, VERSION, Profile, host_issue_ks, profile_ks, profile_solver,
                           set_batch_size, synthetic_profile)


def test_profile_ks_are_the_papers_fractions():
    assert profile_ks(48) == (6, 12, 24, 32, 48)
    assert profile_ks(3) == (1, 2, 3)
    assert profile_ks(1) == (1,)
    with pytest.raises(ValueError):
        profile_ks(0)


# ----------------------------------------------------------------- resizing
def _net(text):
    return Net(parse_text(text, caffe_pb2.NetParameter), TRAIN, mode="CPU")


TAIL = """
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_resize_dummy_data_refills_constant_tops(build_net):
    net = _net("""
layer { name: "d" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 2 dim: 3 } shape { dim: 4 }
    data_filler { type: "constant" value: 2 } data_filler { type: "constant" value: 1 } } }
""" + TAIL)
    set_batch_size(net, 7)
    assert net.blobs["data"].shape == (7, 2, 3) and net.blobs["label"].shape == (7,)
    assert net.blobs["ip"].shape == (7, 3)
    assert (net.blobs["data"].data == 2).all() and (net.blobs["label"].data == 1).all()
    assert net_batch_size(net) == 7
    assert np.isfinite(float(net.forward_from_to()))
    # the swap_nets nets (random fillers) too, down and up
    lenet = build_net("lenet", 4)
    for k in (2, 9):
        set_batch_size(lenet, k)
        lenet.forward_backward()
        assert lenet.blobs["ip2"].shape == (k, 5)
        assert build_gmap(lenet).k == k


def test_resize_input_and_memory_data():
    net = _net("""
layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 5 } shape { dim: 4 } } }
""" + TAIL)
    set_batch_size(net, 6)
    assert net.blobs["data"].shape == (6, 5) and net.blobs["ip"].shape == (6, 3)
    mem = _net("""
layer { name: "m" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }
""" + TAIL)
    mem.layers[0].reset(np.arange(48, dtype=np.float32).reshape(12, 1, 2, 2), np.zeros(12))
    set_batch_size(mem, 4)
    mem.forward_from_to()
    assert mem.blobs["data"].shape == (4, 1, 2, 2)
    assert mem.blobs["data"].data[:, 0, 0, 0].tolist() == [0, 4, 8, 12]


def test_resize_data_layer_continues_with_the_next_record(tmp_path):
    """The prefetch thread read ahead at the old size; after the resize the next batch starts
    at the first record not yet consumed."""
    from minicaffe import io as mio
    db = tmp_path / "db"
    with mio.LMDBWriter(db) as w:
        for i in range(40):
            w.put(f"{i:08d}", mio.array_to_datum(np.full((1, 2, 2), i, np.uint8), i % 3)
                  .SerializeToString())
    net = _net(f"""
layer {{ name: "d" type: "Data" top: "data" top: "label"
  data_param {{ source: "{db}" batch_size: 4 backend: LMDB prefetch: 3 }} }}
""" + TAIL)
    seen = []
    for _ in range(2):
        net.forward_from_to()
        seen += net.blobs["data"].data[:, 0, 0, 0].tolist()
    set_batch_size(net, 6)
    for _ in range(2):
        net.forward_from_to()
        assert net.blobs["data"].shape == (6, 1, 2, 2)
        seen += net.blobs["data"].data[:, 0, 0, 0].tolist()
    assert seen == list(range(20))
    set_batch_size(net, 3)
    net.forward_from_to()
    assert net.blobs["data"].data[:, 0, 0, 0].tolist() == [20, 21, 22]
    net.layers[0].close()


def test_resize_refuses_unknown_sources_and_installed_plans(make_solver):
    from swap.runtime import install
    s = make_solver("lenet")
    ex = install(s, "naive")
    with pytest.raises(RuntimeError, match="close its executor"):
        set_batch_size(s.net, 8)
    ex.close()
    set_batch_size(s.net, 8)
    with pytest.raises(ValueError, match="must be positive"):
        set_batch_size(s.net, 0)


# ---------------------------------------------------------------- profiling
def test_profile_solver_measures_real_training_iterations(make_solver, tmp_path):
    s = make_solver("resnet", batch=4)
    budget = 3 * min_budget(build_gmap(s.net).at(8), "naive")
    before = [np.array(p.data) for p in s.net.learnable_params]
    prof = profile_solver(s, budget, (2, 8), warmup=1, iterations=2)
    # every profiled iteration trained
    assert s.iter == 2 * 3
    assert any(not np.array_equal(a, np.asarray(p.data))
               for a, p in zip(before, s.net.learnable_params))
    assert s.net.executor is None and net_batch_size(s.net) == 8
    g = build_gmap(s.net)
    n = g.n_steps
    assert prof.ks == (2, 8) and prof.k_base == 4 and prof.mode == "CPU"
    assert len(prof.steps) == n and [x.layer for x in prof.steps] == [x.name for x in g.steps]
    for k in (2, 8):
        cs = [c for c in prof.compute if c.k == k]
        assert len(cs) == 2 * n and all(c.time > 0 for c in cs)
        assert {c.step for c in cs} == set(range(n))
        # the FLOPs of the net as built at k; eq. (1) up to the loss (one value per batch)
        flops = sum(c.flops for c in cs) / 2
        assert flops == pytest.approx(g.at(k).flops(), rel=1e-3)
        tr = prof.transfers_at(k)
        fms = len(g.feature_maps())
        assert sum(t.kind == "offload" for t in tr) == 2 * fms
        assert sum(t.kind == "prefetch" for t in tr) == 2 * fms
        assert all(t.time > 0 and t.nbytes > 0 and not t.concurrent for t in tr)
        assert np.isfinite(prof.step_times(k)).all()
    assert [k for k, _ in prof.iterations] == [2, 2, 8, 8]
    # what the plans placed, for a plan made elsewhere to compare with (minicaffe plan)
    assert prof.meta["layout"] == g.at(2).layout()
    assert prof.meta["layout"]["feature_maps"] == len(g.feature_maps()) > 0
    # the models fit on it
    m = ComputeModel.from_profile(prof)
    assert (m.step_times(g) > 0).all()
    p = PCIeModel.from_profile(prof)
    assert p.h2d > 0 and p.d2h > 0
    # JSON round trip
    path = tmp_path / "p.json"
    prof.save(path)
    again = Profile.load(path)
    assert again == prof
    d = json.loads(path.read_text())
    assert d["schema"] == SCHEMA and d["version"] == VERSION and d["device"].startswith("CPU")
    # gzipped, as docs/results keeps them; found by name with or without the .gz
    import gzip
    from swap.profiler import saved_profile
    folder = tmp_path / "saved"
    folder.mkdir()
    assert saved_profile(folder, "net") is None
    gz = folder / "net_profile.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert saved_profile(folder, "net") == str(gz) and Profile.load(gz) == prof
    (folder / "net_profile.json").write_bytes(path.read_bytes())
    assert saved_profile(folder, "net") == str(folder / "net_profile.json")
    (folder / "bad_profile.json.gz").write_bytes(b"{")
    with pytest.raises(ValueError, match="bad_profile.json.gz: not JSON"):
        Profile.load(folder / "bad_profile.json.gz")


def test_profile_solver_times_the_hosts_issue_at_small_k_without_swaps(make_solver, tmp_path):
    """host_ks: after the compute profile, real training iterations at the small ks under the
    plan "none" (nothing offloaded, nothing prefetched), kept apart from the compute samples;
    the net is left at the compute profile's last k; CPU profiles take none by default."""
    s = make_solver("resnet", batch=4)
    budget = 3 * min_budget(build_gmap(s.net).at(8), "naive")
    prof = profile_solver(s, budget, (4, 8), warmup=1, iterations=1, host_ks=(1, 2))
    n = build_gmap(s.net).n_steps
    assert s.iter == 2 * 2 + 2 * 8            # 2 + 3 hooked and 3 whole at each host k
    assert net_batch_size(s.net) == 8 and s.net.executor is None
    assert prof.meta["host_runs"] == [[1, 8], [2, 8]]
    assert prof.meta["host_ks"] == [1, 2]
    # and per k, the median host time of whole iterations run without the timing hooks
    assert [x["k"] for x in prof.meta["host_sums"]] == [1, 2]
    assert all(x["whole"] > 0 for x in prof.meta["host_sums"])
    for k in (1, 2):
        hs = [c for c in prof.host_samples if c.k == k]
        assert len(hs) == 3 * n and {c.step for c in hs} == set(range(n))
        assert all(c.host is not None and c.host > 0 for c in hs)
    assert {c.k for c in prof.compute} == {4, 8}
    assert not [t for t in prof.transfers if t.k in (1, 2)]
    again = Profile.load(prof.save(tmp_path / "h.json") or tmp_path / "h.json")
    assert again == prof
    # the default on the CPU: none
    s2 = make_solver("resnet", batch=4)
    assert profile_solver(s2, budget, (4,), warmup=0, iterations=1).host_samples == ()
    assert host_issue_ks(63) == (3, 7, 15) and host_issue_ks(4) == (1,)
    with pytest.raises(ValueError, match="host_ks"):
        profile_solver(s2, budget, (4,), host_ks="small")


def test_profile_solver_marks_the_solver_step_around_the_pass(make_solver, tmp_path):
    """Each measured iteration records its whole Solver.step: the solver update lies after the
    last backward step (its tail), clearing the parameter diffs before the pass (its head).
    Both are slowed down here by a known amount, and the fitted overhead holds them."""
    import time as _time
    s = make_solver("lenet", batch=4)
    budget = 4 * min_budget(build_gmap(s.net).at(8), "naive")
    update, clear = s.apply_update, s.net.clear_param_diffs

    def slow_update(*a, **kw):
        _time.sleep(0.2)
        return update(*a, **kw)

    def slow_clear():
        _time.sleep(0.15)
        return clear()
    s.apply_update = slow_update
    s.net.clear_param_diffs = slow_clear
    try:
        prof = profile_solver(s, budget, (4, 8), warmup=1, iterations=2)
    finally:
        del s.apply_update
        s.net.__dict__.pop("clear_param_diffs", None)
    assert [x.k for x in prof.solver_steps] == [4, 4, 8, 8]
    for x, (k, t_pass) in zip(prof.solver_steps, prof.iterations):
        assert x.k == k
        assert x.tail >= 0.2 and x.head >= 0.15
        assert x.seconds == pytest.approx(x.head + t_pass + x.tail)
    m = ComputeModel.from_profile(prof)
    assert m.overhead_at(6) >= 0.35
    # the host's time to issue each step is recorded (on the CPU: the step's own time)
    assert all(c.host == c.time for c in prof.compute)
    # the pass (the time origin of the samples) holds neither (LeNet's pass takes a few ms,
    # tens on a loaded machine: it once took over 60 ms under two pytest workers and other
    # work; the shorter sleep is 150 ms): its steps lie within it
    for k in prof.ks:
        t_pass = max(t for kk, t in prof.iterations if kk == k)
        assert t_pass < 0.15 and all(0 <= c.start and c.start + c.time <= t_pass
                                     for c in prof.compute if c.k == k)
    path = tmp_path / "p.json"
    prof.save(path)
    assert Profile.load(path).solver_steps == prof.solver_steps


def test_profiling_iterations_train_like_plain_iterations(make_solver):
    """Profiled iterations at k are ordinary training iterations at k: two of them give the
    weights of a solver built at batch k and trained for two iterations."""
    s = make_solver("lenet", batch=4)
    budget = 4 * min_budget(build_gmap(s.net).at(8), "naive")
    profile_solver(s, budget, (8,), warmup=1, iterations=1)
    ref = make_solver("lenet", batch=8)
    ref.step(2)
    for p, q in zip(s.net.learnable_params, ref.net.learnable_params):
        assert np.array_equal(np.asarray(p.data), np.asarray(q.data))


def test_profile_files_are_checked(build_net, tmp_path):
    g = build_gmap(build_net("lenet", 4))
    prof = synthetic_profile(g, (1, 2), ComputeModel.uniform(ThroughputCurve(1e9, 1e4)),
                             PCIeModel(1e9, 1e9))
    path = tmp_path / "p.json"
    prof.save(path)
    d = json.loads(path.read_text())
    prof.check_net(g)
    other = build_gmap(build_net("resnet", 4))
    with pytest.raises(ValueError, match="does not match net 'resnet_like'"):
        prof.check_net(other)
    d["version"] = 99
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="version 99 is not supported"):
        Profile.load(path)
    path.write_text(json.dumps({"schema": "something else"}))
    with pytest.raises(ValueError, match="not a minicaffe swap profile"):
        Profile.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        Profile.load(path)
    d["version"] = VERSION
    del d["compute"]
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="malformed"):
        Profile.load(path)


def test_synthetic_profile(build_net):
    g = build_gmap(build_net("resnet", 4))
    m = ComputeModel.uniform(ThroughputCurve(1e9, 1e4))
    pcie = PCIeModel(2e9, 1e9)
    prof = synthetic_profile(g, (4, 8), m, pcie)
    assert prof.meta["synthetic"] and prof.k_base == 4
    assert np.allclose(prof.step_times(8), m.step_times(g.at(8)))
    off = [t for t in prof.transfers if t.k == 8 and t.kind == "offload"]
    assert all(t.time == pytest.approx(t.nbytes / 1e9) for t in off)
    noisy = synthetic_profile(g, (4, 8), m, pcie, noise=0.1, seed=3)
    assert not np.allclose(noisy.step_times(8), prof.step_times(8))


# ------------------------------------------------------------ scratch reserve
def test_profiling_with_a_scratch_model_retries_an_overflow_and_lowers_k_max(make_solver,
                                                                           monkeypatch):
    """Algorithm 2's M_ws on the CPU with a fake device: every dry run 'measures' T bytes of
    transients per image and overflows like the GPU's strict reserve when the reserve (what
    the budget leaves, at least S(k)) is smaller.  The ks come from k_max under the (too small)
    estimate; the first k that overflows is retried once with the reserve the error names,
    and k_max shrinks to what the measured transients leave."""
    from swap.arena import align
    from swap.profiler import ScratchModel, max_batch_scratch
    from swap.runtime import Executor, ScratchOverflow, TransientProfile

    s = make_solver("resnet", batch=4)
    g = build_gmap(s.net)
    T = min_budget(g.at(2), "naive") - min_budget(g.at(1), "naive")   # bytes per image
    budget = min_budget(g.at(32), "naive")
    orig = Executor.end_dry_run

    def fake(self, check=True):
        first = self._meter is not None and self._meter.active
        tp = orig(self, check)
        if not first:
            return tp
        peak = T * self.gmap.k
        tp = self.transients = TransientProfile((peak,), 0, (), self.layout)
        if check and self.layout.scratch < peak:
            raise ScratchOverflow("fake overflow", budget=self.budget, k=self.gmap.k,
                                  min_budget=tp.budget(0, 0), scratch=tp.reserve(0, 0),
                                  peak=peak)
        return tp
    monkeypatch.setattr(Executor, "end_dry_run", fake)

    model = ScratchModel(lambda k: T * k // 4, margin=0.0, slack=0)
    fractions = (0.9, 1.0)
    k0 = max_batch_scratch(g, budget, model)
    ks = profile_ks(k0, fractions)
    true_k_max = max_batch_scratch(g, budget, lambda k: align(T * k))
    assert true_k_max < ks[0] < k0 < 32
    lines = []
    prof = profile_solver(s, budget, ks, scratch=model, plan_budget=budget,
                          fractions=fractions, log=lines.append)
    k_max = prof.meta["k_max"]             # the fit rounds up: a byte more can cost one k
    assert k_max == max_batch_scratch(g, budget, model) and true_k_max - 1 <= k_max <= true_k_max
    assert len(prof.ks) == 2 and prof.ks[-1] == k_max < ks[0]
    # the first k: one dry-run iteration, the overflow, then the point again at the new k_max
    assert prof.meta["runs"] == [[ks[0], 1]] + [[k, 2] for k in prof.ks]
    assert s.iter == 1 + 2 * len(prof.ks)
    assert any("too small at minibatch" in x and "instead with a reserve" in x for x in lines)
    assert any(x.startswith("k_max is now") for x in lines)
    # every profiled k ran with a reserve holding its transients, inside the budget
    for k, reserve in prof.meta["scratch"]:
        assert reserve >= T * k
        assert min_budget(g.at(k), "naive") + reserve <= budget
    a, b = model.fit()
    assert a == pytest.approx(0.0, abs=1.0) and b == pytest.approx(T)


def test_an_overflow_within_k_max_retries_the_same_k(make_solver, monkeypatch):
    """An overflow at a k that still fits is retried once at that k, with the reserve the
    error names; a second overflow there is raised (and so is the first, without a model)."""
    from swap.profiler import ScratchModel
    from swap.runtime import Executor, ScratchOverflow

    calls = []

    def once(self, check=True):
        if check and self._meter is not None and self._meter.active:
            self._meter.stop()
            calls.append(self.layout.scratch)
            if len(calls) == 1:
                raise ScratchOverflow("fake", k=self.gmap.k, scratch=1 << 20, peak=1 << 10)
    monkeypatch.setattr(Executor, "end_dry_run", once)
    s = make_solver("lenet", batch=4)
    budget = 4 * min_budget(build_gmap(s.net).at(8), "naive") + (1 << 20)
    lines = []
    prof = profile_solver(s, budget, (4,), scratch=ScratchModel(margin=0, slack=0),
                          log=lines.append)
    assert prof.ks == (4,) and prof.meta["runs"] == [[4, 1], [4, 2]] and s.iter == 3
    assert calls[1] >= 1 << 20 and "minibatch 4 again" in lines[0]


def test_a_second_overflow_at_the_same_k_is_raised(make_solver, monkeypatch):
    from swap.profiler import ScratchModel
    from swap.runtime import Executor, ScratchOverflow

    def always(self, check=True):
        if check and self._meter is not None and self._meter.active:
            self._meter.stop()
            raise ScratchOverflow("fake", k=self.gmap.k, scratch=1 << 10, peak=1 << 10)
    monkeypatch.setattr(Executor, "end_dry_run", always)
    s = make_solver("lenet", batch=4)
    budget = 4 * min_budget(build_gmap(s.net).at(8), "naive")
    with pytest.raises(ScratchOverflow):
        profile_solver(s, budget, (4,), scratch=ScratchModel(margin=0, slack=0))
    assert s.net.executor is None
    with pytest.raises(ScratchOverflow):      # no model: raised at once, as before
        profile_solver(s, budget, (4,))


def test_scratch_model_fit_and_estimate(build_net):
    from swap.profiler import ScratchModel, scratch_estimate
    g = build_gmap(build_net("resnet", 4))
    est = scratch_estimate(g)
    assert 0 < est(1) < est(8) <= 8 * est(1)
    m = ScratchModel.from_gmap(g, margin=0.1, slack=512)
    assert m.fit() is None and m(8) >= int(est(8) * 1.1) + 512
    m.add(10, 1000)
    m.add(20, 1500)
    m.add(30, 2100)
    a, b = m.fit()
    assert b == pytest.approx(55.0)
    assert all(a + b * k >= y - 1e-6 for k, y in m.points.items())
    assert "fitted to the transients measured at k = 10, 20, 30" in m.describe()


def test_k_max_is_bounded_by_pinned_host_memory(make_solver, monkeypatch):
    """The naive plans' offloaded bytes must fit the host budget: k_max is the largest k whose
    plan fits both the device budget and the pinned host memory."""
    from swap.plan import make_plan
    from swap.profiler import default_host_budget, max_batch_scratch
    g = build_gmap(make_solver("resnet", batch=4).net)
    budget = min_budget(g.at(64), "naive")
    free = max_batch_scratch(g, budget)
    assert free >= 64
    host = make_plan(g.at(20), "naive", None).host_bytes
    k = max_batch_scratch(g, budget, host_budget=host)
    assert k == 20 < free
    assert make_plan(g.at(k + 1), "naive", None).host_bytes > host
    assert max_batch_scratch(g, budget, lambda k: 0, host_budget=host) == 20
    assert max_batch_scratch(g, budget, host_budget=1) == 0
    monkeypatch.setenv("MINICAFFE_HOST_BUDGET", "3G")
    assert default_host_budget() == 3 << 30
    monkeypatch.delenv("MINICAFFE_HOST_BUDGET")
    assert default_host_budget() > 0


def test_largest_k_reaches_its_limit():
    from swap.plan import largest_k
    for limit in (1, 2, 5, 20, 31, 32, 33, 1000):
        for edge in (1, 3, 16, 19, 20, 21, 40, 999, 5000):
            assert largest_k(lambda k: k <= edge, limit) == min(edge, limit), (limit, edge)
    assert largest_k(lambda k: False, 10) == 0 and largest_k(lambda k: True, 0) == 0


def test_a_fragmented_reserve_is_retried_larger(make_solver, monkeypatch):
    """Transients that need 20 % more reserve than their peak (the reserve holds the bytes,
    not in one piece): the profile point overflows, is retried with the reserve the error
    names, overflows again, and the third attempt, 25 % larger, trains."""
    import swap.profiler as profiler
    from swap.profiler import ScratchModel
    from swap.runtime import Executor, ScratchOverflow, TransientProfile

    s = make_solver("resnet", batch=4)
    g = build_gmap(s.net)
    T = min_budget(g.at(2), "naive") - min_budget(g.at(1), "naive")
    budget = 4 * min_budget(g.at(8), "naive")
    orig_end, orig_install = Executor.end_dry_run, profiler._install_naive
    reserves = []

    def install(solver, budget, strategy="naive", scratch=None):
        reserves.append(scratch)
        return orig_install(solver, budget, strategy, scratch)

    def fake(self, check=True):
        first = self._meter is not None and self._meter.active
        tp = orig_end(self, check)
        if not first:
            return tp
        peak = T * self.gmap.k
        tp = self.transients = TransientProfile((peak,), 0, (), self.layout)
        if check and reserves[-1] < 1.2 * peak:
            raise ScratchOverflow("fake fragmented overflow", budget=self.budget,
                                  k=self.gmap.k, min_budget=tp.budget(0, 0),
                                  scratch=peak, peak=peak)
        return tp
    monkeypatch.setattr(profiler, "_install_naive", install)
    monkeypatch.setattr(Executor, "end_dry_run", fake)
    model = ScratchModel(lambda k: 0, margin=0.0, slack=0)
    prof = profile_solver(s, budget, (8,), scratch=model, plan_budget=budget)
    assert prof.ks == (8,)
    assert len(reserves) == 3 and reserves[0] < reserves[1] < reserves[2], reserves
    assert reserves[2] >= 1.2 * T * 8 > reserves[1] == T * 8
    assert prof.meta["runs"] == [[8, 1], [8, 1], [8, 2]]


def test_scratch_model_expected_is_the_least_squares_line():
    """The prediction (expected) goes through the middle of the measured transient peaks; the
    reserve's line (need) lies above every one of them."""
    from swap.profiler import ScratchModel
    S = ScratchModel(lambda k: 7 * k, margin=0.0, slack=0)
    assert S.expected(10) == S.need(10) == 70          # nothing measured: the estimate
    S.add(100, 1000)
    assert S.expected(50) == 500                       # one point: through the origin
    for k, y in ((200, 2400), (300, 2800), (400, 4400)):
        S.add(k, y)
    # least squares over (100, 1000), (200, 2400), (300, 2800), (400, 4400): y = 10.6 k
    assert S.expected(250) == 2650
    assert all(S.need(k) >= y for k, y in S.points.items())
    assert S.need(250) > S.expected(250)
    S.add(100, 900)                                    # a lower repeat keeps the larger peak
    assert S.expected(250) == 2650


def test_host_issue_falls_back_to_the_largest_k_whose_plan_none_fits(make_solver):
    """A host k at which nothing-swapped does not fit the budget is timed at the largest k
    that does (ResNet-152 under the CUDNN engine: k = 12 needed 13.7 GiB of a 12 GiB budget);
    one that cannot fit at all is skipped with a log line."""
    from swap.profiler import profile_host_issue
    s = make_solver("resnet", batch=4)
    g = build_gmap(s.net)
    three, four = (min_budget(g.at(k), "none") for k in (3, 4))
    budget = (three + four) // 2
    lines = []
    samples, runs, meta = profile_host_issue(s, budget, (2, 6), warmup=0, iterations=1,
                                             log=lines.append)
    assert meta["host_ks"] == [2, 3]
    assert [r[0] for r in runs] == [2, 3]
    assert {c.k for c in samples} == {2, 3}
    assert any("minibatch 6" in line and "minibatch 3 instead" in line for line in lines)
    lines.clear()
    samples, runs, meta = profile_host_issue(s, min_budget(g.at(1), "none") // 2, (1,),
                                             warmup=0, iterations=1, log=lines.append)
    assert meta["host_ks"] == [] and samples == [] and "does not fit" in lines[0]


def test_a_profiled_k_that_does_not_fit_once_shaped_is_profiled_at_the_largest_that_does(
        make_solver):
    """The ks come from a GMAP taken at another k; shaped for k, the layers may need more
    (cuDNN's workspaces at that shape). The naive plan's BudgetError names the largest k that
    fits: that k is profiled instead, the larger ones are dropped, and k_max follows."""
    s = make_solver("resnet", batch=4)
    g = build_gmap(s.net)
    fits = 5
    budget = min_budget(g.at(fits), "naive")
    assert min_budget(g.at(fits + 1), "naive") > budget
    lines = []
    prof = profile_solver(s, budget, (2, fits + 3, fits + 5), log=lines.append)
    assert prof.ks == (2, fits)
    assert any(f"Minibatch {fits + 3} does not fit" in x and f"minibatch {fits} instead" in x
               for x in lines)
    assert s.net.executor is None


def test_a_profiled_k_with_nothing_that_fits_below_it_is_raised(make_solver):
    from swap.plan import BudgetError
    s = make_solver("resnet", batch=4)
    g = build_gmap(s.net)
    with pytest.raises(BudgetError):
        profile_solver(s, min_budget(g.at(1), "naive") // 2, (2,))


def test_scratch_model_extra_adds_the_training_loops_own_buffers():
    """ScratchModel(extra=): bytes the training loop allocates beside the layers' transients
    (an NCCL worker's flat buffers) are added at every k, before the floor; describe says so."""
    from swap.arena import align
    from swap.profiler import ScratchModel
    plain = ScratchModel(lambda k: 1000 * k, margin=0.10, slack=1 << 20)
    extra = ScratchModel(lambda k: 1000 * k, margin=0.10, slack=1 << 20, extra=460 << 20)
    for k in (1, 64, 512):
        assert extra(k) == align(int(1000 * k * 1.10) + (1 << 20) + (460 << 20))
        assert extra(k) >= plain(k) + (460 << 20) - 512
    extra.add(64, 5 << 20)                           # measured transients: the line, plus extra
    assert extra(64) == align(int((5 << 20) * 1.10) + (1 << 20) + (460 << 20))
    assert "plus 460.00 MiB for the training loop's own buffers" in extra.describe()
    floored = ScratchModel(lambda k: 0, margin=0, slack=0, floor=1 << 30, extra=460 << 20)
    assert floored(8) == 1 << 30                     # a larger floor still wins
    assert "own buffers" not in plain.describe()


def test_a_raised_k_max_still_gets_every_fraction_profiled(make_solver, monkeypatch):
    """The estimate before any measurement is too large (a small first k_max); the first dry
    run measures less, k_max rises, and the ks left are every fraction of the new k_max that
    no profiled k covers: 1/8 of it is profiled too, not only the fractions after the first
    (GoogLeNet on the H200: 76 of a first k_max 611, then 309.. of 1236, and nothing at 154)."""
    from swap.profiler import PROFILE_FRACTIONS, ScratchModel, max_batch_scratch, profile_ks
    from swap.runtime import Executor, TransientProfile

    s = make_solver("resnet", batch=4)
    g = build_gmap(s.net)
    T = min_budget(g.at(2), "naive") - min_budget(g.at(1), "naive")   # bytes per image
    budget = min_budget(g.at(96), "naive")
    orig = Executor.end_dry_run

    def fake(self, check=True):                      # every dry run measures no transients
        first = self._meter is not None and self._meter.active
        tp = orig(self, check)
        if first:
            tp = self.transients = TransientProfile((0,), 0, (), self.layout)
        return tp
    monkeypatch.setattr(Executor, "end_dry_run", fake)
    model = ScratchModel(lambda k: 3 * T * k, margin=0.0, slack=0)    # the first guess: 3 T
    k0 = max_batch_scratch(g, budget, model)
    first = profile_ks(k0, PROFILE_FRACTIONS)
    lines = []
    prof = profile_solver(s, budget, first, scratch=model, plan_budget=budget,
                          fractions=PROFILE_FRACTIONS, log=lines.append)
    k_max = prof.meta["k_max"]
    assert k_max > 2 * k0                            # the measured transients raised it
    final = profile_ks(k_max, PROFILE_FRACTIONS)
    assert prof.ks[0] == first[0] and abs(first[0] - final[0]) > 0.25 * final[0]
    assert set(final) <= set(prof.ks)                # every fraction of the final k_max
    assert len(prof.ks) == len(final) + 1
    assert any("k_max is now" in x for x in lines)


def test_fit_none_profiles_small_k_with_every_map_pinned_and_the_largest_naive(make_solver):
    """fit_none: a k below the largest at which every feature map fits pinned runs so (the
    dynamic plan, nothing swapped); one where they do not, and the largest k always, run
    under the naive plan, whose transfers the PCIe model needs."""
    from swap.profiler import set_batch_size
    s = make_solver("resnet", batch=4)
    maps = frozenset(build_gmap(s.net).feature_maps())

    def need(k, strategy, pinned=frozenset()):      # the net as the profiler shapes it
        set_batch_size(s.net, k)
        return min_budget(build_gmap(s.net), strategy, pinned)
    budget = (need(3, "dynamic", maps) + need(4, "naive")) // 2
    # pinned, the maps of 2 fit and those of 3 do not; naive fits 4
    assert need(2, "dynamic", maps) <= budget < need(3, "dynamic", maps)
    assert need(4, "naive") <= budget
    lines = []
    prof = profile_solver(s, budget, (1, 2, 3, 4), warmup=0, iterations=1, fit_none=True,
                          log=lines.append)
    assert prof.meta["plans"] == [[1, "pinned"], [2, "pinned"], [3, "naive"], [4, "naive"]]
    assert not prof.transfers_at(1) and not prof.transfers_at(2)
    assert prof.transfers_at(3) and prof.transfers_at(4)
    assert sum("with every feature map pinned" in ln for ln in lines) == 2
    assert {c.k for c in prof.compute} == {1, 2, 3, 4}
    # a k at which the maps fit pinned is still profiled under naive when it is the largest
    prof = profile_solver(s, budget, (1,), warmup=0, iterations=1, fit_none=True)
    assert prof.meta["plans"] == [[1, "naive"]] and prof.transfers_at(1)
    # off by default
    prof = profile_solver(s, budget, (1, 4), warmup=0, iterations=1)
    assert prof.meta["plans"] == [[1, "naive"], [4, "naive"]]
    from swap.runtime import install
    with pytest.raises(ValueError, match="buffer ids or 'all'"):
        install(s, "dynamic", budget, pinned="every")


def test_copy_calibration_times_the_steps_with_every_map_kept(make_solver):
    """calibrate_copies: the smallest k profiled under the naive plan runs again with every
    feature map kept, each step timed as the profile times its steps; where that does not fit
    the budget the calibration is skipped with a log line.  Off by default on the CPU."""
    from swap.profiler import calibrate_copy_cost, set_batch_size
    s = make_solver("resnet", batch=4)
    maps = frozenset(build_gmap(s.net).feature_maps())

    def need(k, strategy, pinned=frozenset()):
        set_batch_size(s.net, k)
        return min_budget(build_gmap(s.net), strategy, pinned)
    budget = need(4, "dynamic", maps) + (1 << 20)
    lines = []
    it0 = s.iter
    prof = profile_solver(s, budget, (2, 4), warmup=0, iterations=2, calibrate_copies=True,
                          log=lines.append)
    cal = prof.meta["copy_calibration"]
    assert cal["k"] == 2 and cal["iterations"] == 3 and prof.meta["copy_runs"] == [[2, 3]]
    assert len(cal["kept"]) == len(prof.steps) and all(t >= 0 for t in cal["kept"])
    # no device to wait on the CPU; the host's time per recorded pass is kept all the same
    assert cal["head_start"] == [0.0] * 3 and len(cal["host_pass"]) == 3
    assert all(h > 0 for h in cal["host_pass"])
    assert any(ln.startswith("Copy calibration: minibatch 2") for ln in lines)
    assert s.iter == it0 + 2 * 2 + 3              # the calibration's iterations train too
    assert net_batch_size(s.net) == 4             # left at the last profiled k
    assert "copy_calibration" not in profile_solver(s, budget, (2,), warmup=0,
                                                    iterations=1).meta
    # every map kept does not fit: skipped, and said
    small = need(2, "naive")
    lines = []
    assert calibrate_copy_cost(s, small, 2, 0, 1, log=lines.append) == (None, 0)
    assert "does not fit the budget" in lines[0]


def test_the_head_start_is_a_multiple_of_the_host_time_capped():
    """The kept run's device wait ahead of a timed pass: COPY_CALIBRATION_HEAD_START times
    the host's time to issue the pass before it, at most the cap, none before any pass."""
    from swap.profiler import (COPY_CALIBRATION_HEAD_START, COPY_CALIBRATION_HEAD_START_CAP,
                               head_start_seconds)
    assert head_start_seconds(0.0) == 0.0
    assert head_start_seconds(0.1) == pytest.approx(COPY_CALIBRATION_HEAD_START * 0.1)
    assert head_start_seconds(60.0) == COPY_CALIBRATION_HEAD_START_CAP
    assert head_start_seconds(0.2, factor=2.0, cap=0.3) == pytest.approx(0.3)
    assert COPY_CALIBRATION_HEAD_START > 1.0     # the timed pass's hooks cost the host more


def test_a_disturbed_copy_calibration_runs_again(make_solver, monkeypatch):
    """A calibration the model would find disturbed (the host slowed down between the naive
    run and the kept one) runs once more at the same k, and the second is the one kept; the
    iterations of both train and are counted."""
    import swap.profiler as P
    s = make_solver("resnet", batch=4)
    set_batch_size = P.set_batch_size
    set_batch_size(s.net, 4)
    budget = min_budget(build_gmap(s.net), "dynamic",
                        frozenset(build_gmap(s.net).feature_maps())) + (1 << 20)
    asked = []

    def disturbed_once(profile, cal):
        asked.append(cal["k"])
        return len(asked) == 1
    monkeypatch.setattr(P, "_calibration_disturbed", disturbed_once)
    lines = []
    it0 = s.iter
    prof = profile_solver(s, budget, (2, 4), warmup=0, iterations=2, calibrate_copies=True,
                          log=lines.append)
    assert asked == [2]                          # the retry is the last: not asked again
    assert prof.meta["copy_runs"] == [[2, 3], [2, 3]]
    assert prof.meta["copy_calibration"]["k"] == 2
    assert sum("disturbed" in ln and "running it again" in ln for ln in lines) == 1
    assert s.iter == it0 + 2 * 2 + 3 + 3
    # on the CPU the model uses no calibration, so none is ever judged disturbed
    monkeypatch.undo()
    assert P._calibration_disturbed(prof, prof.meta["copy_calibration"]) is False


def test_low_profile_k_is_the_smallest_k_the_device_sets_the_pace_of():
    """low_profile_k: the smallest k whose device time (the smallest profiled k's per image)
    is at least LOW_K_MARGIN times the host's least whole iteration, where it lies more than
    PROFILE_COVERED below the smallest profiled k; None without host sums."""
    from swap.profiler import LOW_K_MARGIN, PROFILE_COVERED, ComputeSample, low_profile_k
    # ResNet-152 at 12 GiB, session 28: 141.99 ms of naive steps at 49, the host 68.76 ms
    comp = [ComputeSample(k=49, step=j, flops=1.0, time=t, start=0.0)
            for _ in range(2) for j, t in enumerate((0.07099, 0.071))]
    comp += [ComputeSample(k=99, step=0, flops=2.0, time=0.3, start=0.0)]
    sums = [{"k": 3, "host": 0.076, "whole": 0.0709}, {"k": 9, "host": 0.073, "whole": 0.06876}]
    assert LOW_K_MARGIN == 1.5 and PROFILE_COVERED == 0.25
    assert low_profile_k(comp, [49, 99], sums) == 36           # ceil(1.5 x 68.76 / 2.898)
    assert low_profile_k(comp, [99, 49], sums, margin=2.0) is None   # 48: covered by 49
    assert low_profile_k(comp, [49, 99], [{"k": 9, "host": 0.06876}]) == 36   # no "whole"
    assert low_profile_k(comp, [49, 99], ()) is None
    assert low_profile_k(comp, [49, 99], [{"k": 1, "host": 0.0001, "whole": 0.0001}]) is None


def test_a_low_k_is_profiled_after_the_hosts_issue_times(make_solver, monkeypatch):
    """low_k: the k of low_profile_k is profiled under the same plan after the host's issue
    times, last in ks, its iterations in meta["runs"]; the net is left at the k profiled
    before it.  Off on the CPU by default."""
    import swap.profiler as P
    s = make_solver("resnet", batch=4)
    budget = 3 * min_budget(build_gmap(s.net).at(8), "naive")
    seen = []

    def low(compute, done, host_sums):
        seen.append((sorted(done), [x["k"] for x in host_sums]))
        return 2
    monkeypatch.setattr(P, "low_profile_k", low)
    lines = []
    it0 = s.iter
    prof = profile_solver(s, budget, (4, 8), warmup=1, iterations=1, host_ks=(1,),
                          low_k=True, log=lines.append)
    assert seen == [([4, 8], [1])]
    assert prof.ks == (4, 8, 2) and prof.meta["plans"] == [[4, "naive"], [8, "naive"],
                                                           [2, "naive"]]
    assert prof.meta["runs"] == [[4, 2], [8, 2], [2, 2]]
    assert {c.k for c in prof.compute} == {2, 4, 8} and prof.transfers_at(2)
    assert s.iter - it0 == 3 * 2 + 8              # and the host's 8 at k = 1
    assert net_batch_size(s.net) == 8 and s.net.executor is None
    assert any(ln.startswith("Profiling minibatch 2 too") for ln in lines)
    s2 = make_solver("resnet", batch=4)
    assert profile_solver(s2, budget, (4,), warmup=0, iterations=1, host_ks=(1,)).ks == (4,)
    assert len(seen) == 1


def test_copy_calibration_k_is_one_the_device_sets_the_pace_of():
    """The calibration's k: the smallest naive k whose steps take at least three times the
    host's least issue time (COPY_CALIBRATION_DEVICE_MARGIN), then the smallest as a
    fallback; the smallest alone without host times or where no k qualifies."""
    from swap.profiler import ComputeSample, copy_calibration_ks

    def samples(per_k):     # two steps per iteration, two iterations, ``per_k`` s per iteration
        return [ComputeSample(k=k, step=j, flops=0.0, time=t / 2, start=0.0)
                for k, t in per_k.items() for _ in range(2) for j in range(2)]
    comp = samples({8: 0.030, 16: 0.060, 32: 0.120})
    sums = [{"k": 1, "host": 0.040}, {"k": 2, "host": 0.018}]
    assert copy_calibration_ks(comp, [8, 16, 32], sums) == [16, 8]     # 0.060 >= 3 x 0.018
    # twice the host's time is not enough: ResNet-34 at 41 (2.1x) fitted a prefetch at 23 %
    sums = [{"k": 1, "host": 0.040}, {"k": 2, "host": 0.028}]
    assert copy_calibration_ks(comp, [8, 16, 32], sums) == [32, 8]     # 0.060 < 3 x 0.028
    assert copy_calibration_ks(comp, [8, 16, 32], [{"k": 1, "host": 0.010}]) == [8]
    assert copy_calibration_ks(comp, [8, 16, 32], [{"k": 1, "host": 0.070}]) == [8]
    assert copy_calibration_ks(comp, [16, 8], ()) == [8]


def test_profile_calibrates_at_the_chosen_k_and_falls_back(make_solver, monkeypatch):
    """profile_solver tries copy_calibration_ks's minibatches in turn: the first whose kept
    plan fits is the calibration; each try's iterations are counted in meta["copy_runs"]."""
    import swap.profiler as P
    s = make_solver("resnet", batch=4)
    maps = frozenset(build_gmap(s.net).feature_maps())

    def need(k, strategy, pinned=frozenset()):
        P.set_batch_size(s.net, k)
        return min_budget(build_gmap(s.net), strategy, pinned)
    monkeypatch.setattr(P, "copy_calibration_ks", lambda comp, ks, sums: [4, 2])
    roomy = need(4, "dynamic", maps) + (1 << 20)
    prof = profile_solver(s, roomy, (2, 4), warmup=0, iterations=1, calibrate_copies=True)
    assert prof.meta["copy_calibration"]["k"] == 4 and prof.meta["copy_runs"] == [[4, 3]]
    # kept at 4 does not fit where the naive plan at 4 and kept at 2 do: 2 after 4
    tight = max(need(4, "naive"), need(2, "dynamic", maps))
    assert tight < need(4, "dynamic", maps)
    prof = profile_solver(s, tight, (2, 4), warmup=0, iterations=1, calibrate_copies=True)
    assert prof.meta["copy_calibration"]["k"] == 2
    assert prof.meta["copy_runs"] == [[4, 0], [2, 3]]


# ---------------------------------------------- chunked convolutions' rules (session 38)
CONV_NET = """
layer { name: "in" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 4 dim: 2 dim: 5 dim: 5 } shape { dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "c" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def test_chunk_rules_now_reads_each_cudnn_convolutions_rule():
    """The profiler records how each cuDNN convolution cuts a minibatch into calls
    (``ConvolutionLayer.chunk_rule``): none for the CAFFE engine, none without chunks or a
    bound per image, else (limit, bytes per image, multiple) and its calls at k, which are
    ``_chunks_at``'s."""
    from minicaffe import engine as engines
    from minicaffe.cudnn import ops
    from swap.profiler import chunk_rules_now
    net = _net(CONV_NET)
    layer = next(layer for layer in net.layers if layer.name == "conv")
    assert chunk_rules_now(net, 33) == {}                      # CAFFE engine here
    cut = engines.CudnnOptions(workspace_limit=100, workspace_per_image=10, chunks=True,
                               fit_fastest=False)
    assert layer.chunk_rule(cut) == (100, 10, 1)
    assert layer.chunk_rule(engines.CudnnOptions(workspace_limit=100, workspace_per_image=10,
                                                 chunks=False)) is None
    assert layer.chunk_rule(engines.CudnnOptions(workspace_limit=100)) is None
    for k in (4, 10, 11, 33):
        assert layer._chunks_at(k, cut) == ops.workspace_chunks(k, 100, 10, 1)
    layer.engine, layer._cudnn = engines.CUDNN, cut
    assert chunk_rules_now(net, 33) == {"conv": [100, 10, 1, 4]}   # 33 images, 10 a call
    assert chunk_rules_now(net, 10) == {"conv": [100, 10, 1, 1]}
