#!/usr/bin/env python3
"""Import circles between the files of each library crate: exits 1 and prints them if there are any.

A file's imports are the `crate::a::b` and `super::b` paths it names (in `use` lines and inline); each resolves to the
deepest module file that exists (`src/a/b.rs`, `src/a/b/mod.rs`, else `src/a.rs` ...). A file's own
`mod` children and the crate root (`lib.rs`, which only declares and re-exports) are not edges.
Usage: python3 scripts/import_cycles.py [crate ...]   (default: workbench experiments strategies datasets)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"crate((?:::[a-z_][a-z0-9_]*)+)")
SUPER = re.compile(r"\bsuper((?:::[a-z_][a-z0-9_]*)+)")
GROUP = re.compile(r"use crate::\{([^;]*)\}", re.S)


def module_file(src: Path, parts: list[str]) -> Path | None:
    """The file of the deepest existing module among the prefixes of `parts`."""
    for n in range(len(parts), 0, -1):
        for candidate in (src.joinpath(*parts[:n]).with_suffix(".rs"), src.joinpath(*parts[:n], "mod.rs")):
            if candidate.exists():
                return candidate
    return None


def imports(src: Path, file: Path) -> set[Path]:
    text = re.sub(r"//[^\n]*", "", file.read_text())
    paths = [m.group(1).strip(":").split("::") for m in PATH.finditer(text)]
    # `super::x` from src/a/b.rs (module a::b) or src/a/b/mod.rs (module a::b) names a::x.
    here = list(file.relative_to(src).with_suffix("").parts)
    if here[-1] == "mod":
        here = here[:-1]
    paths += [here[:-1] + m.group(1).strip(":").split("::") for m in SUPER.finditer(text)]
    # `use crate::{a::X, b}`: each top-level name of the group.
    for group in GROUP.finditer(text):
        for item in re.split(r",(?![^{]*\})", group.group(1)):
            name = item.strip().split("::")[0].strip("{} \n")
            if name:
                paths.append([name] + item.strip().split("::")[1:])
    found = set()
    for parts in paths:
        target = module_file(src, [p for p in parts if p and p[0].islower()])
        if target and target != file and target.name != "lib.rs":
            found.add(target)
    return found


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main() -> int:
    crates = sys.argv[1:] or ["workbench", "experiments", "strategies", "datasets"]
    failed = False
    for crate in crates:
        src = ROOT / crate / "src"
        files = sorted(src.rglob("*.rs"))
        graph = {f: imports(src, f) for f in files}
        found = cycles(graph)
        for component in found:
            failed = True
            names = ", ".join(str(f.relative_to(src)) for f in sorted(component))
            print(f"{crate}: import circle among {names}")
        if not found:
            print(f"{crate}: no import circles ({len(files)} files)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
