"""Session 20, call 4: the tuner's decision on VGG-16 (one GPU, CUDNN, 12 GiB) from c2's
profile with --recompute conv1_1, timed: train_dynamic (stage 2 and the install) and tune()
again on the same GMAP, as tuner_table.py times them."""
import sys
import time

sys.path.insert(0, ".")
from scripts.swap_budgets import _solver                     # noqa: E402
from swap.tuner import profile_models, train_dynamic, tune  # noqa: E402

solver = _solver("vgg16", 32, "CUDNN", "GPU")
t0 = time.perf_counter()
ex, td = train_dynamic(solver, 12 << 30, auto_batch=True, method="bisect", log=print,
                       keep_epochs=False, profile="dv/p/vgg16_profile.json",
                       recompute=("conv1_1",))
t_tuner = time.perf_counter() - t0
dec = td.decision
g = ex.gmap
model, pcie = profile_models(td.profile, g, "segment")
for objective in ("throughput", "largest"):
    t0 = time.perf_counter()
    d = tune(g, td.plan_budget, model, pcie, method="bisect", k_max=dec.k_max,
             scratch=td.scratch, recompute=("conv1_1",), objective=objective)
    dt = time.perf_counter() - t0
    n = sum(1 for e in d.evaluations if not e.pruned)
    print(f"RESULT objective {objective}: k* {d.k_star} (largest {d.k_largest}), "
          f"recomputes {bool(d.plan.recomputed)}, decision {dt:.1f} s, {n} k evaluated")
print(f"RESULT train_dynamic {t_tuner:.1f} s, k* {dec.k_star}")
