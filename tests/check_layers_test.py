#!/usr/bin/env python3
"""Self-test of scripts/check_layers.py: on a copy of the tree it passes, and it fails, naming the file
and the layer, on a planted upward include (core → engine), on the old sampler → model include, on an
internal include in code built on the public API (cli/train.cc, src/server/), and on a declared dependency nothing
includes. Usage: check_layers_test.py --root REPO"""
import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile


def run_check(script, root):
    r = subprocess.run([sys.executable, str(script), '--root', str(root)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--root', required=True)
    repo = pathlib.Path(parser.parse_args().root)
    script = repo / 'scripts' / 'check_layers.py'
    failures = []

    def expect(name, root, want_code, *parts):
        code, out = run_check(script, root)
        if code != want_code or any(p not in out for p in parts):
            failures.append(f'{name}: exit {code} (want {want_code}), output lacks one of {parts}:\n{out}')

    with tempfile.TemporaryDirectory() as tmp:
        def fresh_copy(name):
            root = pathlib.Path(tmp) / name
            shutil.copytree(repo / 'src', root / 'src')
            shutil.copy(repo / 'CMakeLists.txt', root / 'CMakeLists.txt')
            return root

        expect('unchanged tree', fresh_copy('clean'), 0, 'every include')

        def planted(name, rel, anchor, include):
            """A copy with `#include "<include>"` added after `anchor` in src/<rel>."""
            root = fresh_copy(name)
            path = root / 'src' / rel
            path.write_text(path.read_text().replace(anchor, anchor + f'#include "{include}"\n', 1))
            return root

        expect('planted core -> engine include', planted('upward', 'core/status.h', '#pragma once\n', 'engine/engine.h'),
               1, 'src/core/status.h:', '"engine/engine.h"', 'layer core')
        expect('planted sampler -> model include',
               planted('sideways', 'sampler/generate.h', '#pragma once\n', 'model/transformer.h'),
               1, 'src/sampler/generate.h:', 'layer sampler')
        expect('internal include in a command built on the facade',
               planted('facade', 'cli/train.cc', '#include "cli/commands.h"\n', 'train/trainer.h'),
               1, 'src/cli/train.cc:', '"train/trainer.h"', 'public API')
        expect('internal include in the server, built on the facade',
               planted('server', 'server/http.cc', '#include "server/canvas.h"\n', 'api/model_impl.h'),
               1, 'src/server/http.cc:', '"api/model_impl.h"', 'public API')

        root = fresh_copy('unused')
        cmake = root / 'CMakeLists.txt'
        cmake.write_text(cmake.read_text().replace('dc_layer(sampler DEPS dc_core', 'dc_layer(sampler DEPS dc_tokenizer dc_core', 1))
        expect('declared but unused dependency', root, 1, 'layer sampler declares dc_tokenizer')

    for f in failures:
        print(f, file=sys.stderr)
    print('check_layers_test: ' + ('FAILED' if failures else 'ok'))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
