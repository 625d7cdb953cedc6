"""Run `minicaffe train ARGS` in this process, then write every cuDNN convolution choice it made
(geometry, direction, workspace limit asked, algorithm, its workspace, the search's time) to
OUT.json.  Session 34, call e: which algorithms VGG-16's convolutions ran at 221 under the
12 GiB plan and with every map kept under 130 GiB.  Usage: python3 algos.py OUT.json ARGS..."""
import json
import sys

from minicaffe.cli import main
from minicaffe.cudnn import ops

rc = main(sys.argv[2:])
rows = []
for p in list(ops._plans.values()):
    g = p.geom
    for key, c in p.choices.items():
        rows.append({"x": list(g.x_shape), "w": list(g.w_shape), "direction": key[0],
                     "limit": int(key[1]), "algo": c.name, "workspace": int(c.workspace),
                     "time_ms": float(c.time_ms), "source": c.source})
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "choices": rows}, f, indent=0)
print(f"{len(rows)} choices, rc {rc}")
