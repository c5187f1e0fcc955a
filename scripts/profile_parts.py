"""
Where a step's device time goes, from scripts/profile_train.py's tables: one column a profile.

    python scripts/profile_parts.py OUT/gated_deltanet/stage3_profile.txt OUT/attention/stage3_profile.txt
    python scripts/profile_parts.py base.txt new.txt --names=base,new --plot=parts.png

Each part is the device time a step (the table's Self CUDA over its profiled steps) of the
operators that make it: the matrix products (aten::mm), the delta rule's and the additive
family's operators, the short conv, the decay, the output norm, softmax attention (SDPA through
cuDNN, flash or the memory-efficient kernel; in a student's profile the teacher's forward) and
the fused CE + KL, each forward and backward. "The rest" is the device's busy time less all of
them: Inductor's norms, activations and adds, the optimizer, the aten calls inside an operator
(its own Self CUDA leaves them out: the conv's backward sums dw with one), and any part below the
table's rows. A part missing from a table (not in that model, or below its smallest row, which
the footer gives) prints "-", and so does its difference. Each column after the first has beside
it its difference from the first (later minus first): with a base first and a change second, a
negative difference is time the change saves.
"""

import argparse
import os
import re
import sys

PARTS = [  # (part, operators whose Self CUDA it sums)
    ("matrix products", ["aten::mm"]),
    ("the delta rule, forward", ["linearize::delta_rule_fwd"]),
    ("the delta rule, backward", ["linearize::delta_rule_bwd"]),
    ("the additive family, forward", ["linearize::add_chunk_fwd"]),
    ("the additive family, backward", ["linearize::add_chunk_bwd"]),
    ("the short conv, forward", ["linearize::short_conv_fwd"]),
    ("the short conv, backward", ["linearize::short_conv_bwd"]),
    ("the decay, forward", ["linearize::log_decay_fwd"]),
    ("the decay, backward", ["linearize::log_decay_bwd"]),
    ("the output norm, forward", ["linearize::norm_fwd"]),
    ("the output norm, backward", ["linearize::norm_bwd"]),
    ("softmax attention, forward", ["aten::_cudnn_attention_forward", "aten::_flash_attention_forward",
                                    "aten::_efficient_attention_forward"]),
    ("softmax attention, backward", ["aten::_cudnn_attention_backward", "aten::_flash_attention_backward",
                                     "aten::_efficient_attention_backward"]),
    ("the fused CE + KL", ["linearize::distill_loss"]),
]
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def read(path):
    """(steps, busy ms a step, {operator: Self CUDA ms over all its steps}) of one profile table.
    The columns are found by the header's names (split at runs of two spaces or more); a row is
    its name, then one number a column, so its Self CUDA is counted from the row's end."""
    try:
        with open(path) as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    head = re.search(r"profile: (\d+) steps? .*?device busy ([\d.]+) ms a step", text)
    if not head:
        raise ValueError(f"{path}: not a GPU step table of scripts/profile_train.py (no 'profile: N "
                         f"steps ... device busy X ms a step' line)")
    ops, numbers, at = {}, None, None
    for line in text.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if numbers is None and cols[0] == "Name" and "Self CUDA" in cols:
            numbers, at = len(cols) - 1, len(cols) - cols.index("Self CUDA")  # at: from the row's end
            continue
        fields = line.split()
        if numbers is None or len(fields) <= numbers or fields[0].startswith("-"):
            continue
        m = re.fullmatch(r"([\d.]+)(us|ms|s)", fields[-at])
        name = " ".join(fields[:-numbers])
        if m and name != "ProfilerStep*":  # the steps themselves, not an operator
            ops.setdefault(name, float(m[1]) * UNITS[m[2]])  # an Inductor kernel's two rows: one kept
    if not ops:
        raise ValueError(f"{path}: no operator rows under a 'Name ... Self CUDA' header")
    return int(head[1]), float(head[2]), ops


def parts(path):
    """([(part, ms a step or None where no operator of it is listed)], then ('the rest', ms) and
    ('the device busy', ms); the smallest listed operator's ms a step; the project's operators
    (linearize::) that no part claims)."""
    steps, busy, ops = read(path)
    out = []
    for part, names in PARTS:
        got = [ops[n] for n in names if n in ops]
        out.append((part, sum(got) / steps if got else None))
    out.append(("the rest", busy - sum(ms for _, ms in out if ms is not None)))
    out.append(("the device busy", busy))
    claimed = {n for _, names in PARTS for n in names}
    unclaimed = sorted(n for n in ops if n.startswith("linearize::") and n not in claimed)
    return out, min(ops.values()) / steps, unclaimed


def fmt(ms):
    """A table cell: ms to its tenth ("-" where missing; + 0.0: never "-0.0")."""
    return "-" if ms is None else f"{round(ms, 1) + 0.0:.1f}"


def table(paths, names):
    cols, least, unclaimed = zip(*(parts(p) for p in paths))
    head = "| ms a step | " + " | ".join(
        names[:1] + [f"{n} | {n} - {names[0]}" for n in names[1:]]) + " |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for i, (part, _) in enumerate(cols[0]):
        if all(c[i][1] is None for c in cols):
            continue  # a part none of these profiles has
        first = cols[0][i][1]
        cells = [fmt(first)]
        for c in cols[1:]:
            ms = c[i][1]
            cells += [fmt(ms), fmt(None if ms is None or first is None else ms - first)]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("\n-: not among the table's rows (not in that model, or below its smallest row: "
                 + ", ".join(f"{n} {ms:.2f} ms" for n, ms in zip(names, least)) + " a step)")
    for n, ops in zip(names, unclaimed):
        if ops:
            lines.append(f"{n}: in the rest, operators of no part: {', '.join(ops)}")
    return lines, cols


def plot(cols, names, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(names)))
    colors = plt.get_cmap("tab20").colors
    bars = {}  # part -> its first bar, for the legend, in the parts' order
    for j, c in enumerate(cols):  # one bar a profile, its parts and the rest side by side
        left = 0.0
        for k, (part, ms) in enumerate(c[:-1]):  # not the busy total, which the bar's length is
            if ms:
                bars.setdefault(k, (ax.barh(j, ms, left=left, color=colors[k % len(colors)]), part))
                left += ms
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("device time a step, ms")
    ax.legend(*zip(*(bars[k] for k in sorted(bars))), fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="+", help="stage<N>_profile.txt files of scripts/profile_train.py")
    ap.add_argument("--names", default="", help="a column name a profile, comma-separated (default: the files' folders, or names)")
    ap.add_argument("--plot", default="", help="also draw the parts as stacked bars into this image")
    args = ap.parse_args()
    names = args.names.split(",") if args.names else [
        os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in args.profiles]
    if not args.names and len(set(names)) < len(names):  # profiles of one folder: their files' names
        names = [os.path.splitext(os.path.basename(p))[0] for p in args.profiles]
    if len(names) != len(args.profiles):
        ap.error(f"--names: {len(names)} names for {len(args.profiles)} profiles")
    if any("|" in n for n in names):
        ap.error("--names: a name holds '|', which would split the table's cells")
    if missing := [p for p in args.profiles if not os.path.isfile(p)]:
        ap.error(f"{missing[0]}: no such file")
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        ap.error(f"--plot={args.plot}: no such folder")
    try:
        lines, cols = table(args.profiles, names)
    except ValueError as e:
        sys.exit(f"profile_parts.py: {e}")
    print("\n".join(lines))
    if args.plot:
        plot(cols, names, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
