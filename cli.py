"""
Settings from the command line: --key=value pairs, typed by the fields of a dataclass, with errors
of one line that name the key and what it expects (train.py's settings; nanoGPT's configurator,
with argparse in place of exec, as nanochat later chose).
"""

import argparse
import difflib
from dataclasses import asdict, fields

KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def parse(argv, cls, fail):
    """['--key=value', ...] -> {key: typed value} for the fields of dataclass cls, only what argv
    gives (a bare --key means true); fail(message) stops on anything else."""
    names = [f.name for f in fields(cls)]
    parser = argparse.ArgumentParser(allow_abbrev=False)
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


def describe(settings, width=100):
    """A dataclass's values as --key=value lines: what a run does, and the command that reruns it."""
    lines, line = [], "settings:"
    for k, v in asdict(settings).items():
        item = f" --{k}={v}"
        if len(line) + len(item) > width:
            lines.append(line)
            line = " "
        line += item
    return "\n".join(lines + [line])
