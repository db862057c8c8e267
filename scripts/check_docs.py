"""Checks the documentation: relative links resolve, README.md stays short, every guide's quick path runs.

Usage (python3, standard library only, from anywhere; paths are relative to the repository root):
  python3 scripts/check_docs.py --links
      Every relative link and image in README.md, docs/*.md and results/README.md must name an
      existing file or directory (an anchor is not checked, only its file). Prints FILE:LINE: LINK
      for each broken one.
  python3 scripts/check_docs.py --quick-paths [--bin PATH] [--timeout S] [--skip GUIDE,...]
      Every guide in docs/ starts with a "## Quick path" section whose `sh` block follows the line
      <!-- quick-path -->. Each block runs with `bash -euo pipefail` in the repository root, under a
      timeout (120 s), with ./target/release/ringbench replaced by --bin. Prints `ok GUIDE (N s)` or
      the failure and its output's tail. A block that changes what git sees under results/ fails.
      docs/hugging-face.md and docs/gpu.md may have no quick path; any other guide without one fails.
Both modes also fail when README.md is longer than 200 lines. Exit status 1 on any failure.
"""
import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
DEFAULT_BIN = "./target/release/ringbench"
MARKER = "<!-- quick-path -->"
# Guides that may go without a quick path (written to another pattern, or by hand on a GPU machine).
MAY_LACK_QUICK_PATH = {"hugging-face.md", "gpu.md"}

# [text](target) and ![alt](target); the target ends at whitespace (a title may follow) or ")".
INLINE_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target (reference definitions), and HTML src/href attributes.
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML_LINK = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def doc_files():
    """The files whose links are checked, in a stable order."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "README.md"]
    return [f for f in files if f.exists()]


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        opener = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and opener:
            fence = opener.group(1)[0] * len(opener.group(1))
            continue
        if fence is not None:
            if stripped.startswith(fence) and stripped.strip(fence[0]).strip() == "":
                fence = None
            continue
        yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def is_external(target):
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def broken_links(path):
    """(line, link) of every relative link in `path` that names no existing file."""
    broken = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        targets += [m.group(1) for m in HTML_LINK.finditer(line)]
        reference = REFERENCE_LINK.match(line)
        if reference:
            targets.append(reference.group(1))
        for target in targets:
            if is_external(target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0].split("?", 1)[0]
            if not file_part:
                continue
            resolved = (ROOT / file_part.lstrip("/")) if file_part.startswith("/") else path.parent / file_part
            if not resolved.exists():
                broken.append((number, target))
    return broken


def readme_too_long():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    if lines > README_MAX_LINES:
        print(f"README.md: {lines} lines; at most {README_MAX_LINES}")
        return True
    return False


def check_links():
    failed = False
    for path in doc_files():
        for number, target in broken_links(path):
            print(f"{path.relative_to(ROOT)}:{number}: {target}")
            failed = True
    return failed


def quick_path(path):
    """The quick path's script, or an error saying what is missing or misplaced."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    headings = [(n - 1, line) for n, line in prose_lines(text) if line.startswith("## ")]
    if not headings or headings[0][1].strip().lower() != "## quick path":
        return None, "its first section is not '## Quick path'"
    section_end = headings[1][0] if len(headings) > 1 else len(lines)
    markers = [i for i, line in enumerate(lines) if line.strip() == MARKER]
    if not markers:
        return None, f"no {MARKER} line"
    start = markers[0]
    if not headings[0][0] < start < section_end:
        return None, f"{MARKER} lies outside the Quick path section"
    opening = start + 1
    if opening >= len(lines) or lines[opening].strip() != "```sh":
        return None, f"the line after {MARKER} is not ```sh"
    for end in range(opening + 1, len(lines)):
        if lines[end].strip() == "```":
            return "\n".join(lines[opening + 1:end]) + "\n", None
    return None, "its ```sh block is not closed"


def results_state():
    """What git sees under results/ (modified files, untracked files and folders), to catch a block
    writing there. Untracked folders are listed whole, so a long job writing inside a folder that was
    already untracked before the block ran does not count against the block. Without git's answer
    the check could not see a write, so it fails instead of passing on nothing."""
    try:
        run = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal", "--", "results"],
                             cwd=ROOT, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"check_docs: git status of results/ failed ({e}): cannot check what a quick path writes")
    if run.returncode != 0:
        sys.exit(f"check_docs: git status of results/ failed (exit {run.returncode}: "
                 f"{run.stderr.strip()}): cannot check what a quick path writes")
    return set(run.stdout.splitlines())


def run_block(guide, script, timeout):
    """(ok, seconds, output) of one quick path."""
    before = results_state()
    started = time.monotonic()
    try:
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        ok, output = run.returncode == 0, run.stdout
        if not ok:
            output += f"\n(exit status {run.returncode})"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        ok, output = False, out + f"\n(timed out after {timeout} s)"
    seconds = time.monotonic() - started
    wrote = results_state() - before
    if wrote:
        ok = False
        output += "\nwrote under results/: " + ", ".join(sorted(line[3:] for line in wrote))
    return ok, seconds, output


def check_quick_paths(binary, timeout, skip):
    if not (ROOT / binary).exists() and not Path(binary).exists():
        print(f"{binary} does not exist: build it first (cargo build --release -p experiments)")
        return True
    failed = False
    for path in sorted((ROOT / "docs").glob("*.md")):
        guide = f"docs/{path.name}"
        script, problem = quick_path(path)
        if script is None:
            if path.name in MAY_LACK_QUICK_PATH and MARKER not in path.read_text(encoding="utf-8"):
                continue
            print(f"FAIL {guide}: {problem}")
            failed = True
            continue
        if path.name in skip or guide in skip:
            print(f"skipped {guide}")
            continue
        if binary != DEFAULT_BIN:
            script = script.replace(DEFAULT_BIN, shlex.quote(binary))
        ok, seconds, output = run_block(guide, script, timeout)
        if ok:
            print(f"ok {guide} ({seconds:.0f} s)")
        else:
            failed = True
            tail = "\n".join("    " + line for line in output.rstrip().splitlines()[-25:])
            print(f"FAIL {guide} ({seconds:.0f} s):\n{tail}")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--links", action="store_true", help="check relative links and README.md's length")
    mode.add_argument("--quick-paths", action="store_true", help="run every guide's quick path")
    parser.add_argument("--bin", default=DEFAULT_BIN, help=f"the ringbench binary (default {DEFAULT_BIN})")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per guide (default 120)")
    parser.add_argument("--skip", default="", help="guides not to run, comma-separated (e.g. own-model.md)")
    args = parser.parse_args()
    failed = readme_too_long()
    if args.links:
        failed |= check_links()
    else:
        skip = {s.strip() for s in args.skip.split(",") if s.strip()}
        failed |= check_quick_paths(args.bin, args.timeout, skip)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
