#!/usr/bin/env python3
"""Checks that the layers of src/ include only what CMakeLists.txt declares (docs/ARCHITECTURE.md).

Each folder src/<layer>/ is one library dc_<layer> declared with `dc_layer(<layer> DEPS ...)` (src/cli/
is the `diffucoder` executable, its `target_link_libraries`). A file of a layer may include its own
headers and those of the layers its DEPS name; every dc_ dependency it declares must be included by
at least one of its files; the declared graph must have no cycle; and the code built on the public
API (FACADE_ONLY: cli/train.cc, cli/grpo.cc, cli/bench.cc, cli/bench_train.cc, the server) includes of src/ only the
folders it lists (bench: and its measurement internals, MEASUREMENT). Fails (exit 1) listing every
violation. Usage: scripts/check_layers.py [--root DIR]   (DIR: the repository, default this script's)
"""
import argparse
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_0-9]+(?:/[a-z_0-9]+)*)/[^"/]+"', re.M)
# The public API (include/diffucoder/) is the api layer's: including it is depending on src/api/.
PUBLIC_INCLUDE = re.compile(r'^\s*#\s*include\s+<diffucoder/[^>]+>', re.M)


# The code built on the public API (docs/ARCHITECTURE.md "The public API is for code outside the library",
# "The server over the facade"): a file or a folder of src/ → the layers whose headers it may include; the
# rest comes through <diffucoder/...>. The commands: the CLI's own helpers; server/: its own files and core's
# utilities (Status / Result), which are no model internals.
FACADE_ONLY = {
    'cli/train.cc': ('cli',),
    'cli/grpo.cc': ('cli',),
    'cli/bench.cc': ('cli',),
    'cli/bench_train.cc': ('cli',),
    'server': ('server', 'core'),
}
# What code of FACADE_ONLY may include from below the facade besides: bench's measurement internals
# (the GEMM peak; a device's counters and the profiler, through api/measure.h).
MEASUREMENT = {'cli/bench.cc': ('ops/peak.h', 'api/measure.h'), 'cli/bench_train.cc': ('ops/peak.h', 'api/measure.h')}


def declared_layers(cmake_text):
    """({layer: set of layers it declares}, {layer: its folder under src/}) from dc_layer(...) and the
    diffucoder executable. A layer's folder is its name
    unless dc_layer names another with DIR (a backend nested in a layer's folder, e.g. ops/vulkan)."""
    layers, dirs = {}, {}
    for m in re.finditer(r'^dc_layer\(\s*([a-z_0-9]+)([^)]*)\)', cmake_text, re.M):
        layers[m.group(1)] = set(re.findall(r'\bdc_([a-z_0-9]+)\b', m.group(2)))
        d = re.search(r'\bDIR\s+([a-z_0-9/]+)', m.group(2))
        dirs[m.group(1)] = d.group(1) if d else m.group(1)
    m = re.search(r'target_link_libraries\(\s*diffucoder\s+PRIVATE([^)]*)\)', cmake_text)
    if m:
        layers['cli'] = set(re.findall(r'\bdc_([a-z_0-9]+)\b', m.group(1)))
        dirs['cli'] = 'cli'
    return layers, dirs


def owner(path, dirs):
    """The layer whose folder holds `path` (relative to src/, '/'-separated): the longest folder prefix."""
    best = None
    for layer, d in dirs.items():
        if (path == d or path.startswith(d + '/')) and (best is None or len(d) > len(dirs[best])):
            best = layer
    return best


def find_cycle(graph):
    state = {}

    def visit(node, path):
        state[node] = 'open'
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 'open':
                return path + [node, dep]
            if dep not in state:
                cycle = visit(dep, path + [node])
                if cycle:
                    return cycle
        state[node] = 'done'
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def check(root):
    root = pathlib.Path(root)
    src = root / 'src'
    layers, dirs = declared_layers((root / 'CMakeLists.txt').read_text())
    errors = []
    folders = sorted(p.name for p in src.iterdir() if p.is_dir())
    for folder in folders:
        if folder not in dirs.values():
            errors.append(f'src/{folder}/ is not a layer declared in CMakeLists.txt (dc_layer({folder} DEPS ...))')
    used = {layer: set() for layer in layers}
    for layer in sorted(layers):
        folder = src / dirs.get(layer, layer)
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob('*')):
            if path.suffix not in ('.h', '.cc') or not path.is_file():
                continue
            if owner(path.parent.relative_to(src).as_posix(), dirs) != layer:
                continue  # a nested layer's file
            text = path.read_text(errors='replace')
            includes = [(m, owner(m.group(1), dirs)) for m in INCLUDE.finditer(text)]
            includes += [(m, 'api') for m in PUBLIC_INCLUDE.finditer(text)]
            for m, target in includes:
                if target is None or target == layer:
                    continue
                used[layer].add(target)
                if target not in layers[layer]:
                    line = text.count('\n', 0, m.start()) + 1
                    allowed = ', '.join(sorted(layers[layer])) or 'nothing'
                    errors.append(f'{path.relative_to(root)}:{line}: includes {m.group(0).split("include", 1)[1].strip()}, '
                                  f'but layer {layer} may include only {layer}/ and {allowed} '
                                  f'(its DEPS in CMakeLists.txt; see docs/ARCHITECTURE.md)')
    for rel, allowed in FACADE_ONLY.items():
        top = src / rel
        if not top.exists():
            errors.append(f'src/{rel}: listed in FACADE_ONLY (scripts/check_layers.py) but missing')
            continue
        paths = [top] if top.is_file() else sorted(p for p in top.rglob('*') if p.suffix in ('.h', '.cc'))
        extra_headers = MEASUREMENT.get(rel, ())
        for path in paths:
            text = path.read_text(errors='replace')
            for m in INCLUDE.finditer(text):
                included = m.group(0).split(chr(34))[1]
                if owner(m.group(1), dirs) not in allowed and included not in extra_headers:
                    line = text.count('\n', 0, m.start()) + 1
                    folders = ', '.join(f + '/' for f in allowed)
                    extra = ''.join(f', "{h}"' for h in extra_headers)
                    errors.append(f'{path.relative_to(root)}:{line}: includes "{included}", but this '
                                  f'code is built on the public API: it may include only {folders} headers{extra} and '
                                  f'<diffucoder/...> (FACADE_ONLY and MEASUREMENT in scripts/check_layers.py)')
    for layer in sorted(layers):
        for dep in sorted(layers[layer] - used[layer]):
            errors.append(f'layer {layer} declares dc_{dep} in CMakeLists.txt but includes nothing from src/{dep}/: '
                          f'drop it from its DEPS')
    cycle = find_cycle(layers)
    if cycle:
        errors.append('the declared layers form a cycle: ' + ' -> '.join(cycle))
    return errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--root', default=str(pathlib.Path(__file__).resolve().parent.parent))
    args = parser.parse_args()
    errors = check(args.root)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f'check_layers: {len(errors)} violation(s)', file=sys.stderr)
        return 1
    print('check_layers: every include is one its layer declares')
    return 0


if __name__ == '__main__':
    sys.exit(main())
