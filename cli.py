"""
Settings from the command line: --key=value pairs, typed by the fields of a dataclass, with errors
of one line that name the key and what it expects (nanoGPT's configurator, with argparse in place
of exec, as nanochat later chose). train.py, sample.py, niah.py and evaluate.py all read their
settings this way; --help prints the script's docstring and every setting with its default and
the comment beside its field. Clock is where a script's seconds went, its last line.
"""

import argparse
import dataclasses
import difflib
import inspect
import re
import shlex
import sys
import textwrap
import time
from dataclasses import MISSING, asdict, fields

import torch

KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def parse(argv, cls, fail, gpu=None):
    """['--key=value', ...] -> {key: typed value} for the fields of dataclass cls, only what argv
    gives (a bare --key means true); fail(message) stops on anything else. --help (or -h) prints
    usage(cls, gpu) and exits."""
    if "--help" in argv or "-h" in argv:
        print(usage(cls, gpu))
        raise SystemExit(0)
    names = [f.name for f in fields(cls)]
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    parser.error = fail  # one line, no usage block
    for f in fields(cls):
        def typed(value, t=f.type, key=f.name):
            if t is bool and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            try:
                if t is not bool:
                    return t(value)
            except ValueError:
                pass
            fail(f"--{key}={value!r}: expected {KINDS[t]}")
        bare = dict(nargs="?", const=True) if f.type is bool else {}
        parser.add_argument(f"--{f.name}", type=typed, default=argparse.SUPPRESS, **bare)
    given, unknown = parser.parse_known_args(argv)
    if unknown:
        near = difflib.get_close_matches(unknown[0][2:].partition("=")[0], names, n=1)
        fail(f"unknown setting {unknown[0]!r}{f' (did you mean --{near[0]}?)' if near else ''}; "
             f"settings are --key=value with key one of: {', '.join(names)}")
    return vars(given)


def defaults(cls):
    """{key: default} of the fields of dataclass cls that have one."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def on_gpu(given):
    """Whether a run takes its GPU defaults: a CUDA GPU is here and --device does not name the
    CPU."""
    return torch.cuda.is_available() and not str(given.get("device", "cuda")).startswith("cpu")


def settings(argv, cls, fail, gpu=None):
    """(cls of the command line's settings, {key: value} of those it gave): each field's default,
    replaced by gpu's on a GPU (on_gpu), then by what argv gives."""
    given = parse(argv, cls, fail, gpu)
    return cls(**{**defaults(cls), **(gpu if gpu and on_gpu(given) else {}), **given}), given


def check(s, rules, fail):
    """fail(one line) for the first setting of s that breaks its rule, one of rules: (key, test,
    what the error says is expected)."""
    for key, ok, want in rules:
        if not ok(getattr(s, key)):
            fail(f"--{key}={getattr(s, key)!r}: expected {want}")


def check_softmax_layers(text, n_layer=None):
    """'7,15,23' -> (7, 15, 23): a hybrid's softmax layers (--softmax_layers), distinct and below
    n_layer when it is given, or a one-line ValueError."""
    parts = [p.strip() for p in text.split(",")] if text else []
    if not all(p.isdigit() for p in parts):
        raise ValueError("expected layer numbers such as 7,15,23")
    layers = tuple(int(p) for p in parts)
    if len(set(layers)) < len(layers):
        raise ValueError("a layer is named twice")
    if n_layer is not None and any(i >= n_layer for i in layers):
        raise ValueError(f"the teacher has {n_layer} layers, numbered 0 to {n_layer - 1}")
    return layers


def usage(cls, gpu=None):
    """--help: the docstring of the module that defines cls (the script), then every setting as
    --key=default with the comment beside its field in the source, under the section comments
    (# --- ... ---) between them; gpu: the defaults a GPU replaces."""
    module = sys.modules[cls.__module__]
    script = (getattr(module, "__file__", None) or "script.py").rsplit("/", 1)[-1]
    rows = []  # (left column, comment) or (section title, None)
    names = {f.name for f in fields(cls)}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        for line in inspect.getsource(klass).splitlines()[1:]:
            line = line.strip()
            if line.startswith("# ---"):
                rows.append((line.strip("#- "), None))
            elif line.startswith("#   ") and rows and rows[-1][1] is not None:  # a comment goes on
                rows[-1] = (rows[-1][0], f"{rows[-1][1]} {line.lstrip('# ')}")
            elif (m := re.match(r"(\w+):[^#]*#\s*(.*)", line)) and m[1] in names:
                names.discard(m[1])  # a subclass's field of the same name would come later
                f = next(f for f in fields(cls) if f.name == m[1])
                value = "" if f.default in ("", MISSING) else shlex.quote(str(f.default))
                rows.append((f"--{f.name}" + ("" if f.default is MISSING else f"={value}"), m[2]))
    width = min(30, max(len(left) for left, c in rows if c is not None) + 2)
    out = [f"usage: python {script} [--key=value ...]   (a bare --key means --key=true)", "",
           (module.__doc__ or "").strip(), "", "settings (--key=default  what it is):"]
    for left, comment in rows:
        if comment is None:
            out.append(f"\n  {left}")
            continue
        if len(left) >= width:  # a long default: its comment starts below it
            out.append(f"  {left}")
            left = ""
        for i, text in enumerate(textwrap.wrap(comment, 98 - width) or [""]):
            out.append(f"  {left if i == 0 else '':<{width}}{text}")
    if gpu:
        out += ["", "on a GPU (unless --device=cpu) these defaults change:",
                describe(argparse.Namespace(**gpu), prefix=" ")]
    return "\n".join(out)


def describe(settings, width=100, prefix="settings:"):
    """A dataclass's (or a namespace's) values as --key=value lines: what a run does, and the
    command that reruns it."""
    lines, line = [], prefix
    values = asdict(settings) if dataclasses.is_dataclass(settings) else vars(settings)
    for k, v in values.items():
        item = f" --{k}={v}"
        if len(line) + len(item) > width:
            lines.append(line)
            line = " "
        line += item
    return "\n".join(lines + [line])


class Clock:
    """Where a script's seconds go. mark(phase) adds the time since the last mark (or the start) to
    `phase`; line() is the script's last line, "time: startup 9.1 s | steps 511.0 s | ... | total
    620.4 s", which scripts/reproduce.py reads into a run's table of where its time went."""

    def __init__(self):
        self.start = self.last = time.time()
        self.phases = {}

    def mark(self, phase, sync=None):
        """sync: called first (torch.cuda.synchronize), so that queued GPU work counts here."""
        if sync is not None:
            sync()
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def line(self):
        parts = [f"{k} {v:.1f} s" for k, v in self.phases.items()]
        return "time: " + " | ".join(parts + [f"total {time.time() - self.start:.1f} s"])


def read_time(line):
    """A Clock's line -> {phase: seconds}, total included."""
    pairs = (p.strip().rsplit(" ", 2) for p in line.removeprefix("time:").split("|"))
    return {name.strip(): float(sec) for name, sec, _ in pairs}
