#!/usr/bin/env python3
"""Keeps the docs true (a ctest test, `check_docs`): every relative link of README.md, BENCHMARKS.md and docs/*.md
points at a file that exists, and every flag a `diffucoder <command> ...` line of them names (in a code block
or an inline code span) is one that `diffucoder <command> --help` lists. With --demo MODEL_DIR it also runs
every code block marked `<!-- runs on the demo model -->` (the line before its fence) with `sh -e`, in a
temporary directory holding a `prompt.py`, `build/diffucoder` and `DIR` standing for BINARY and MODEL_DIR:
each must exit 0. Prints each problem with its file and line; exits 1 if there is any.

Usage: scripts/check_docs.py BINARY [SOURCE_DIR] [--demo MODEL_DIR]
"""
import pathlib
import re
import subprocess
import sys
import tempfile

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"\bdiffucoder ([a-z][a-z-]*)\b([^`]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
CODE_SPAN = re.compile(r"`([^`]+)`")
DEMO_MARK = "<!-- runs on the demo model -->"


def subcommands(binary):
    """The subcommands `diffucoder --help` lists under "Subcommands:"."""
    lines = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout.splitlines()
    start = lines.index("Subcommands:") + 1
    return {line.split()[0] for line in lines[start:] if line.strip()}


def help_flags(binary, command, cache):
    """The long flags `diffucoder COMMAND --help` lists (None: not a subcommand: `diffucoder build/...` is a path)."""
    if "" not in cache:
        cache[""] = subcommands(binary)
    if command not in cache[""]:
        return None
    if command not in cache:
        r = subprocess.run([binary, command, "--help"], capture_output=True, text=True, check=True)
        cache[command] = set(FLAG.findall(r.stdout)) | {"--help"}
    return cache[command]


def code_texts(lines):
    """(line number, text) of every code-block line and every inline code span."""
    fenced = False
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield n, line
        else:
            for span in CODE_SPAN.findall(line):
                yield n, span


def demo_blocks(lines):
    """(line number, text) of every fenced block whose fence follows the DEMO_MARK line."""
    for n, line in enumerate(lines):
        if line.strip() == DEMO_MARK and n + 1 < len(lines) and lines[n + 1].lstrip().startswith("```"):
            end = next((m for m in range(n + 2, len(lines)) if lines[m].lstrip().startswith("```")), len(lines))
            yield n + 2, "\n".join(lines[n + 2:end])


def run_demo_block(block, binary, model_dir):
    """The block run by sh -e with build/diffucoder and DIR replaced: None when it exits 0, else its output."""
    script = re.sub(r"\bDIR\b", model_dir, block.replace("build/diffucoder", binary))
    with tempfile.TemporaryDirectory() as tmp:
        pathlib.Path(tmp, "prompt.py").write_text("def fib(n):\n", encoding="utf-8")
        r = subprocess.run(["sh", "-ec", script], cwd=tmp, capture_output=True, text=True, timeout=600)
    return None if r.returncode == 0 else f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}"


def check_file(path, root, binary, cache, model_dir=None):
    problems = []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            file_part = target.split("#", 1)[0]
            if file_part and not (path.parent / file_part).exists():
                problems.append(f"{path.relative_to(root)}:{n}: link to a missing file: {target}")
    for n, code in code_texts(lines):
        for command, rest in COMMAND.findall(code):
            flags = help_flags(binary, command, cache)
            if flags is None:
                continue  # "diffucoder is ...": not a command line
            for flag in FLAG.findall(rest.split("|&")[0]):
                if flag not in flags:
                    problems.append(f"{path.relative_to(root)}:{n}: `diffucoder {command}` has no flag {flag}")
    if model_dir is not None:
        for n, block in demo_blocks(lines):
            failure = run_demo_block(block, binary, model_dir)
            if failure is not None:
                problems.append(f"{path.relative_to(root)}:{n}: the demo block failed, {failure}")
    return problems


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    args = sys.argv[1:]
    model_dir = None
    if "--demo" in args:
        i = args.index("--demo")
        model_dir = str(pathlib.Path(args[i + 1]).resolve())
        del args[i:i + 2]
    binary = str(pathlib.Path(args[0]).resolve())
    root = pathlib.Path(args[1] if len(args) > 1 else pathlib.Path(__file__).resolve().parent.parent)
    files = [root / "README.md", root / "BENCHMARKS.md"] + sorted((root / "docs").glob("*.md"))
    cache = {}
    problems = [p for f in files for p in check_file(f, root, binary, cache, model_dir)]
    for p in problems:
        print(p)
    print(f"check_docs: {len(files)} files, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
