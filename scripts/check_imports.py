#!/usr/bin/env python3
"""The directions of imports inside each library crate: exits 1 and prints what breaks them.

Two checks. Directions: each crate declares its top-level modules (a folder or a file under src/) in
layers, lowest first (LAYERS below); a module may import modules of earlier layers only, never a later
one nor another of its own layer, and a module missing from the declaration is an error too. Circles:
no import circle between the files of a crate, whatever their modules.

A file's imports are the `crate::a::b` and `super::b` paths it names (in `use` lines and inline); each
resolves to the deepest module file that exists (`src/a/b.rs`, `src/a/b/mod.rs`, else `src/a.rs` ...).
A file's own `mod` children and the crate root (`lib.rs`, which only declares and re-exports) are not
edges.
Usage: python3 scripts/check_imports.py [crate ...]   (default: every crate in LAYERS)
       python3 scripts/check_imports.py --self-test   (a crate with a wrong import must fail)
"""
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each crate's top-level modules in layers, lowest first: a module imports only from earlier layers.
LAYERS = {
    "workbench": [
        ["error", "primitive", "backends", "dtype", "simd"],
        # Per-rank timelines: recorded by the transports, the ring and the model, knowing none.
        ["trace"],
        # The fused device kernels' CubeCL source and the trait a backend offers them through.
        ["cube"],
        ["host"],
        ["block"],
        # Tile math and moving bytes: neither knows the other, nor rings, models or training.
        ["kernels", "transport"],
        # The ring knows kernels and transports, not the models built on it.
        ["ring"],
        # Models know the ring, not how they are trained.
        ["model"],
        # Hugging Face checkpoints are an edge of the model; training does not know them.
        ["hf", "train"],
        # GGUF files are read onto the model as Hugging Face checkpoints are.
        ["gguf"],
    ],
    "experiments": [
        # NaN-aware extremes, for every table and model that folds numbers.
        ["extremes"],
        # A process's MPI: one command's rank, or a launched sweep point's world.
        ["mpi_rank"],
        ["units", "markdown", "alloc", "hardware", "npy", "spec", "simulator", "memory_model",
         "dir_lock", "backend", "pretrained", "timeline"],
        # A process's rank over NCCL: its devices on the chosen backend.
        ["nccl_rank"],
        # Cost models on the simulator and the hardware profiles.
        ["results", "measure", "grid_model", "tile_model"],
        # Line charts; ring passes drawn as per-rank timelines.
        ["plot", "timeline_chart"],
        # Commands whose specs, datasets and measurements the experiment kinds reuse.
        ["exorl", "line_retrieval", "bench", "perplexity"],
        ["kinds"],
        ["runner", "comparison"],
        ["reproduce", "attn", "hf"],
    ],
    "strategies": [
        ["error"],
        # The one visibility rule; the trait and layouts; work counted and the ring's time simulated.
        ["visibility"],
        ["partition"],
        ["work", "ring_time"],
        ["contiguous", "striped", "zigzag", "doc_zigzag"],
        # The solver may start from the fixed layouts.
        ["balanced"],
        ["registry"],
    ],
    "reference": [
        # The one comparison, the bounds it is held to, seeded inputs.
        ["compare", "bounds", "inputs"],
        # The float64 attention, then the bf16 bound on its errors.
        ["attention"],
        ["bf16"],
    ],
    "datasets": [
        ["rng", "words", "packing"],
        ["line_retrieval", "exorl"],
        ["tokenizer"],
        ["gguf_vocab"],
        ["hf_tokenizer", "chat"],
    ],
}
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


def module(src: Path, file: Path) -> str:
    """The top-level module a file belongs to: its folder or its file name under src/."""
    return file.relative_to(src).parts[0].removesuffix(".rs")


def wrong_directions(crate: str, src: Path, graph: dict[Path, set[Path]], layers: list[list[str]]) -> list[str]:
    """Every import against the declared layers, and every module the declaration misses."""
    layer = {m: i for i, group in enumerate(layers) for m in group}
    problems = []
    for file in sorted(graph):
        here = module(src, file)
        if here in ("lib", "main"):  # the crate roots: they declare, re-export and start
            continue
        if here not in layer:
            problems.append(f"{crate}: module '{here}' ({file.relative_to(src)}) is not declared in "
                            f"scripts/check_imports.py's LAYERS")
            continue
        for target in sorted(graph[file]):
            there = module(src, target)
            if there == here or there not in layer:
                continue
            if layer[there] >= layer[here]:
                below = [m for group in layers[: layer[here]] for m in group]
                problems.append(f"{crate}: {file.relative_to(src)} imports {target.relative_to(src)}: "
                                f"'{here}' may import only {', '.join(below) or 'nothing'}")
    return problems


def check(crate: str, src: Path, layers: list[list[str]]) -> list[str]:
    files = sorted(src.rglob("*.rs"))
    graph = {f: imports(src, f) for f in files}
    problems = wrong_directions(crate, src, graph, layers)
    for component in cycles(graph):
        names = ", ".join(str(f.relative_to(src)) for f in sorted(component))
        problems.append(f"{crate}: import circle among {names}")
    return problems


def self_test() -> int:
    """A crate whose lower module imports a higher one must fail; without that import it passes."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        (src / "kernels").mkdir(parents=True)
        (src / "lib.rs").write_text("pub mod kernels;\npub mod ring;\n")
        (src / "ring.rs").write_text("use crate::kernels::tile::Tile;\n")
        (src / "kernels" / "mod.rs").write_text("pub mod tile;\n")
        (src / "kernels" / "tile.rs").write_text("pub struct Tile;\n")
        layers = [["kernels"], ["ring"]]
        if check("self-test", src, layers):
            print("self-test: a crate with no wrong import failed the check")
            return 1
        (src / "kernels" / "tile.rs").write_text("use crate::ring::Engine;\npub struct Tile;\n")
        found = check("self-test", src, layers)
        if not any("kernels/tile.rs imports ring.rs" in p for p in found):
            print(f"self-test: kernels importing ring was not caught: {found}")
            return 1
    print("self-test: a deliberately wrong import (kernels -> ring) is caught")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    crates = sys.argv[1:] or list(LAYERS)
    failed = False
    for crate in crates:
        src = ROOT / crate / "src"
        problems = check(crate, src, LAYERS[crate])
        for problem in problems:
            failed = True
            print(problem)
        if not problems:
            print(f"{crate}: imports keep their declared directions, no circles "
                  f"({len(list(src.rglob('*.rs')))} files)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
