"""
Decoding against the length of the context: the teacher's key/value cache grows with every
token it has read, a student's recurrent state does not.

For each model and context length L the script reads a prompt of L tokens (the prefill, timed),
then times one-token decoding steps from the caches and counts the bytes the caches hold, with
random weights of SmolLM2-135M (speed does not depend on the weights):

    python scripts/decode_speed.py                                   # CPU: up to 4096 tokens
    python scripts/decode_speed.py --lengths=1024,4096,16384,65536 --B=8   # a GPU
    python scripts/decode_speed.py --mixers=gated_deltanet,kda,swa

The teacher decodes as model.py runs it: each step appends to the cache and repeats the KV
heads for the query heads, so it reads its whole cache at least twice, as simple decoders do.
Each student runs in every form --backends names (on CUDA by default twice: through triton_ops.py,
where a decoding step's state update is one fused kernel, and as PyTorch ops alone), which shows
where the kernels pay, and every model through each of --decoders: fast (decode.py: static
caches, and on CUDA each block compiled and the step replayed from a CUDA graph; its prefill
column includes making the static caches and capturing the graph; the compilation happens in
a model's warm-up run), graph (the same without torch.compile) and plain (model.py's loop, its caches
growing). A model's first, untimed run at the shortest length warms it up. On a machine
shared with other work, times wander: --rounds sweeps everything again and keeps the least. A row's step is
the median of --steps synchronized steps after 2 warm-ups. Prints a markdown table as rows
finish, appends it to --out and draws decode_speed.png beside it.
"""

import argparse
import functools
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import checkpoint  # noqa: E402
import decode  # noqa: E402
import mixers  # noqa: E402
import model as M  # noqa: E402
import plots  # noqa: E402


def cache_bytes(caches):
    """Bytes held by a model's decoding caches (one dict of tensors per layer)."""
    return sum(t.numel() * t.element_size() for c in caches for t in c.values())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure(net, L, B=1, steps=16, seed=0):
    """(prefill seconds, median seconds of a decoding step, cache bytes after the steps) for a
    prompt of L tokens, B sequences. The steps feed fixed tokens: their values do not change the
    work."""
    dev = next(net.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, net.config.vocab_size, (B, L), generator=gen).to(dev)
    caches = [dict() for _ in net.model.layers]
    sync(dev)
    t0 = time.perf_counter()
    net(prompt, caches=caches, last_only=True)
    sync(dev)
    prefill = time.perf_counter() - t0
    tok, pos = prompt[:, -1:], L
    for _ in range(2):  # warm-up
        net(tok, caches=caches, start=pos)
        pos += 1
    times = []
    for _ in range(steps):
        sync(dev)
        t0 = time.perf_counter()
        net(tok, caches=caches, start=pos)
        sync(dev)
        times.append(time.perf_counter() - t0)
        pos += 1
    return prefill, sorted(times)[len(times) // 2], cache_bytes(caches)


@torch.no_grad()
def measure_fast(net, L, B=1, steps=16, seed=0, graph=False, compile=False):
    """measure() through decode.Decoder: static caches; graph: the step replayed from a CUDA
    graph; compile: each block through torch.compile. The prefill column counts the prompt, the
    static caches and the graph's capture."""
    dev = next(net.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, net.config.vocab_size, (B, L), generator=gen).to(dev)
    sync(dev)
    t0 = time.perf_counter()
    dec = decode.Decoder(net, prompt, steps + 2, graph=graph, compile=compile)
    sync(dev)
    prefill = time.perf_counter() - t0
    tok = prompt[:, -1]
    for _ in range(2):  # warm-up
        dec.step(tok)
    times = []
    for _ in range(steps):
        sync(dev)
        t0 = time.perf_counter()
        dec.step(tok)
        sync(dev)
        times.append(time.perf_counter() - t0)
    return prefill, sorted(times)[len(times) // 2], cache_bytes(dec.caches)


TIMERS = ("fast", "graph", "plain")  # --decoders' choices


def timers(device):
    """{--decoders' choice: its timer on device}: fast as decode.options("fast") decides it (on
    CUDA a CUDA graph over compiled blocks), graph the same with blocks not compiled, plain."""
    fast = decode.options("fast", device)
    return {"fast": functools.partial(measure_fast, graph=fast["graph"], compile=fast["compile"]),
            "graph": functools.partial(measure_fast, graph=fast["graph"]), "plain": measure}


def read_rows(paths):
    """The rows (model, context, prefill s, step s, cache bytes) of tables this script wrote; a
    later row of the same model and context replaces an earlier one."""
    rows = {}
    for path in paths:
        for line in open(path):
            m = re.match(r"\| (.+?) \| (\d+) \| ([\d.]+) s \| ([\d.]+) ms \| [\d,.]+ \| ([\d,.]+) MiB \|", line)
            if m:
                rows[m[1], int(m[2])] = (m[1], int(m[2]), float(m[3]), float(m[4]) / 1000,
                                         float(m[5].replace(",", "")) * 2**20)
    return list(rows.values())


def plot(rows, path):
    """Two panels against the context length: ms per step, and cache MiB."""
    plt = plots.pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r[0] for r in rows):
        rs = [r for r in rows if r[0] == name]
        Ls = [r[1] for r in rs]
        a.plot(Ls, [1000 * r[3] for r in rs], marker="o", label=name)
        b.plot(Ls, [r[4] / 2**20 for r in rs], marker="o", label=name)
    for ax, y in ((a, "ms per decoding step"), (b, "cache MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(y)
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixers", default="gated_deltanet", help=f"comma-separated students: any of {', '.join(M.MIXERS[1:])}")
    ap.add_argument("--backends", default=None, help=f"comma-separated backends each student runs on: any of "
                    f"{', '.join(mixers.BACKENDS)} (default: triton,torch on CUDA, torch otherwise)")
    ap.add_argument("--decoders", default=None, help="comma-separated: fast (decode.py: static caches, on CUDA "
                    "its blocks compiled and its step a CUDA graph), graph (the same without torch.compile) and plain (model.py's growing caches); default fast,plain on CUDA, plain otherwise")
    ap.add_argument("--lengths", default="256,1024,4096", help="context lengths, comma-separated")
    ap.add_argument("--B", type=int, default=1, help="sequences decoded together")
    ap.add_argument("--steps", type=int, default=16, help="timed decoding steps per row")
    ap.add_argument("--rounds", type=int, default=3,
                    help="sweeps over all models and lengths; a row keeps each time's least value (the run least "
                         "disturbed by other work on the machine)")
    ap.add_argument("--preset", default="smollm2-135m", help=f"model size: {', '.join(M.PRESETS)}")
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if cuda else "float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default="out/decode_speed.md", help="the table is appended here; the PNG goes beside it")
    ap.add_argument("--replot", nargs="+", metavar="TABLE", help="measure nothing: draw the plot from tables "
                    "this script wrote (a later file's rows replace an earlier one's) to --out's PNG")
    args = ap.parse_args(argv)
    if args.replot:
        missing = [p for p in args.replot if not os.path.isfile(p)]
        if missing:
            ap.error(f"--replot: no file {missing[0]}")
        png = args.out if args.out.endswith(".png") else os.path.join(os.path.dirname(args.out) or ".", "decode_speed.png")
        plot(read_rows(args.replot), png)
        print(f"plot: {png}")
        return []
    names = [m for m in args.mixers.split(",") if m]
    decoders = [d for d in (args.decoders or ("fast,plain" if args.device.startswith("cuda") else "plain")).split(",") if d]
    if set(decoders) - set(TIMERS):
        ap.error(f"--decoders={args.decoders!r}: expected any of {', '.join(TIMERS)}")
    backends = [b for b in (args.backends or ("triton,torch" if args.device.startswith("cuda") else "torch")).split(",") if b]
    try:
        for m in names:
            M.check_mixer(m, M.MIXERS[1:])
        for b in backends:
            mixers.check_backend(b, args.device)
        lengths = sorted(int(x) for x in args.lengths.split(","))
        cfg = M.Config.from_preset(args.preset)
    except ValueError as e:
        ap.error(str(e))
    if min(lengths) < 1 or min(args.B, args.steps, args.rounds) < 1:
        ap.error("lengths, B, steps and rounds must be >= 1")
    try:
        checkpoint.check_device(args.device)
    except ValueError as e:
        ap.error(str(e))
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    out = open(args.out, "a")

    def emit(line):
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()

    torch.manual_seed(0)
    teacher = M.SmolLM2(cfg)
    runs = [("teacher (attention)", teacher, None)]
    for m in names:
        student = checkpoint.student_from_teacher(teacher, m)
        if m == "swa":
            runs.append((m, student, None))
        else:
            runs += [(f"{m}, {b}" if len(backends) > 1 else m, student, b) for b in backends]
    runs = [(f"{name}, {d}" if len(decoders) > 1 else name, net, b, timers(args.device)[d])
            for name, net, b in runs for d in decoders]
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    emit(f"\n{args.preset}, batch {args.B}, {args.dtype} on {where}, {time.strftime('%Y-%m-%d')}\n")
    emit("| model | context | prefill | decoding step | tokens/s | cache |")
    emit("|---|---|---|---|---|---|")
    rows, best = [], {}
    try:
        for r in range(args.rounds):
            for name, net, backend, timer in runs:
                net.to(dev, dtype).eval().set_backend(backend)
                if r == 0:
                    timer(net, min(lengths), args.B, steps=1)  # warm-up: first calls, kernel compiles
                for L in lengths:
                    now = timer(net, L, args.B, args.steps)
                    print(f"round {r + 1}/{args.rounds}: {name}, {L} tokens: step {1000 * now[1]:.2f} ms",
                          file=sys.stderr, flush=True)
                    prefill, step, nbytes = best[name, L] = [min(a, b) for a, b in zip(best.get((name, L), now), now)]
                    if r == args.rounds - 1:
                        rows.append((name, L, prefill, step, nbytes))
                        emit(f"| {name} | {L} | {prefill:.2f} s | {1000 * step:.2f} ms | {args.B / step:,.1f} | "
                             f"{nbytes / 2**20:,.2f} MiB |")
                net.cpu()
    finally:
        out.close()
        if rows:
            png = os.path.join(os.path.dirname(args.out) or ".", "decode_speed.png")
            plot(rows, png)
            print(f"plot: {png}")
    return rows


if __name__ == "__main__":
    main()
