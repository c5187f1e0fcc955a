"""
Plots a reader would rather look at than read: the loss curves of a training run.

train.py draws one beside every checkpoint (<out_dir>/<mixer>/stage<N>.png).
"""

import os


def plot(history, path):
    """The loss curves as a PNG (train and val loss; val KL and top-1 agreement)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    if history["train"]:
        a.plot(*zip(*history["train"]), label="train", lw=0.8)
    val = history["val"]
    if val:
        a.plot([v["step"] for v in val], [v["loss"] for v in val], "o-", label="val")
        b.plot([v["step"] for v in val], [v["kl"] for v in val], "o-", color="C2", label="KL(teacher || student)")
        b2 = b.twinx()
        b2.plot([v["step"] for v in val], [v["top1"] for v in val], "s--", color="C3", label="top-1 agreement")
        b2.set_ylabel("top-1 agreement")
        b2.legend(loc="upper right")
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) + ", " + os.path.basename(path)[:-4]
    a.set(xlabel="step", ylabel="stage loss", yscale="log", title=name.replace("stage", "stage "))
    b.set(xlabel="step", ylabel="val KL per token", title="student vs teacher (val)")
    a.legend()
    b.legend(loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path + ".tmp", format="png", dpi=90)
    plt.close(fig)
    os.replace(path + ".tmp", path)
