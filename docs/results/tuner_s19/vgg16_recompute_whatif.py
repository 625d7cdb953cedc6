"""What-if, on the CPU, from a saved profile: VGG-16 under `dynamic` at 12 GiB when conv1_1's
map (and its in-place ReLU) is recomputed from the data before its first backward use instead
of being kept or offloaded.  Not a feature of minicaffe (docs/STATUS.md: what it would take);
an estimate of what it would buy, with the planner's own Algorithm 1 and pin choice.

The recomputed buffer leaves the feature maps the planner may swap or pin; it holds memory
over its forward uses and again from its first backward use to its last; that backward step's
compute grows by the forward time of the steps that write it.  The CPU-built GMAP (the CAFFE
engine's scratch, not the GPU run's cuDNN workspaces) is the one `minicaffe plan` uses.

    python3 docs/results/tuner_s19/vgg16_recompute_whatif.py PROFILE.json [k ...]
"""
import sys

import numpy as np

sys.path.insert(0, ".")
import swap.planner as planner                                     # noqa: E402
from minicaffe.net import TRAIN, Net                               # noqa: E402
from swap.gmap import build_gmap                                   # noqa: E402
from swap.profiler import Profile                                  # noqa: E402
from swap.tuner import Search, profile_models                      # noqa: E402

NAME = "data:conv1_1"


def main(profile, ks):
    net = Net("prototxt/vgg16/dummy.prototxt", TRAIN, mode="CPU")
    gmap0 = build_gmap(net)
    model, pcie = profile_models(Profile.load(profile), gmap0, "segment")
    search = Search(gmap0, 12 << 30, model, pcie, rule="stall", prune=False)
    plain = planner.Sketcher
    for k in ks:
        g = gmap0.at(k)
        budget, times = search.budget_at(k), np.asarray(search.times(k), dtype=float)
        b = next(x.id for x in g.buffers if x.name == NAME)
        buf = g.buffers[b]
        writers = [s.index for s in g.steps[:g.n_forward] if b in s.writes]
        j = buf.backward_uses[0]
        t2 = times.copy()
        t2[j] += times[writers].sum()

        class Recomputing(plain):
            def __init__(self, gmap, budget):
                super().__init__(gmap, budget)
                s = int(self.size_arr[b])
                self.fms = [x for x in self.fms if x != b]
                u = self.base_usage.copy()
                u[buf.uses[0]:buf.forward_uses[-1] + 1] += s
                u[j:buf.uses[-1] + 1] += s
                self.base_usage = u

        out = {}
        for label, cls, tt in (("plain", plain, times), ("conv1_1 recomputed", Recomputing, t2)):
            planner.Sketcher = cls
            try:
                res = planner.choose_pins(g, budget, tt, pcie, rule="stall")
                r = planner.algorithm1(res.sketch, tt, pcie, propagate=True)
            finally:
                planner.Sketcher = plain
            moved = sum(res.sketch.sizes[x] for x in res.sketch.swapped)
            out[label] = (r.total_stall * 1e3, r.t_iter * 1e3, moved / 2**30, res.sketch.fits)
        for label, (stall, t, moved, fits) in out.items():
            print(f"k {k}: {label:19s} stall {stall:6.1f} ms, iteration {t:6.1f} ms "
                  f"({k / t * 1e3:5.1f} images/s), {moved:.2f} GiB offloaded, fits {fits}")
        print(f"       recomputing costs {1e3 * times[writers].sum():.2f} ms before step {j}")


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [176, 190, 200, 210, 221])
