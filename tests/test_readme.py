"""The README's reading path points at the code it names: every line range of its "Read the code"
section ends where the named functions, classes or sections end and starts at them (or at the
comment just above them)."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANGE = re.compile(r"\((?:lines )?(\d+)-(\d+)\)")


def spans(path):
    """{name: (first line, last line)} of a file's functions, classes, methods (Class.method) and
    top-level assignments; a decorated definition starts at its first decorator."""
    tree = ast.parse(open(path).read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = (node.lineno, node.end_lineno)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = (first, node.end_lineno)
            for item in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = (item.lineno, item.end_lineno)
    return out


def reading_path():
    """[(file, names, section number or None, first, last)] for each range the section gives."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("## Read the code"):]
    section = section[:section.index("\n## ", 3)]
    out = []
    for item in re.split(r"\n\d\. ", section)[1:]:
        path = re.match(r"\[`([\w/.]+\.py)`\]", item)[1]
        start = 0
        for m in RANGE.finditer(item):
            before = re.split(r"[.;:]\s", item[start:m.start()])[-1]  # the range's own clause
            names = [n for n in re.findall(r"`([\w.]+)`", before) if not n.endswith(".py")]
            number = re.search(r"[Ss]ection (\d)\s*$", before)
            out.append((path, names, number and int(number[1]), int(m[1]), int(m[2])))
            start = m.end()
    return out


def test_every_range_of_the_reading_path_holds_what_it_names():
    ranges = reading_path()
    assert len(ranges) >= 12 and {r[0] for r in ranges} >= {"model.py", "mixers.py", "distill.py", "train.py"}
    for path, names, number, first, last in ranges:
        lines = open(os.path.join(ROOT, path)).read().splitlines()
        where = f"README: {path} ({first}-{last})"
        if number is not None:  # a numbered section of mixers.py: its heading to the next rule
            assert lines[first - 1].startswith(f"# {number}."), where
            assert last == len(lines) or lines[last].startswith("# ---"), where
            continue
        found = spans(os.path.join(ROOT, path))
        assert names and all(n in found for n in names), (where, names)
        starts, ends = [found[n][0] for n in names], [found[n][1] for n in names]
        assert max(ends) == last, f"{where}: {names} end at line {max(ends)}"
        assert min(starts) - 20 <= first <= min(starts), f"{where}: {names} start at line {min(starts)}"
        assert first == min(starts) or lines[first - 1].startswith("#"), f"{where}: starts inside code"
