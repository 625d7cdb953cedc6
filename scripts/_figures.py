"""What the reproduction scripts' figures share: matplotlib without a display, and saving."""
from __future__ import annotations

import os


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), or None where matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(fig, path, title=None):
    """Title (small, above the panels), tight layout, ``path`` at 120 dpi (its folder made),
    and the figure closed."""
    import matplotlib.pyplot as plt
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
