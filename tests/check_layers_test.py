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

        root = fresh_copy('upward')
        status_h = root / 'src' / 'core' / 'status.h'
        status_h.write_text(status_h.read_text().replace('#pragma once\n', '#pragma once\n#include "engine/engine.h"\n', 1))
        expect('planted core -> engine include', root, 1, 'src/core/status.h:', '"engine/engine.h"', 'layer core')

        root = fresh_copy('sideways')
        gen_h = root / 'src' / 'sampler' / 'generate.h'
        gen_h.write_text(gen_h.read_text().replace('#pragma once\n', '#pragma once\n#include "model/transformer.h"\n', 1))
        expect('planted sampler -> model include', root, 1, 'src/sampler/generate.h:', 'layer sampler')

        root = fresh_copy('facade')
        train_cc = root / 'src' / 'cli' / 'train.cc'
        train_cc.write_text(train_cc.read_text().replace('#include "cli/commands.h"\n',
                                                         '#include "cli/commands.h"\n#include "train/trainer.h"\n', 1))
        expect('internal include in a command built on the facade', root, 1, 'src/cli/train.cc:',
               '"train/trainer.h"', 'public API')

        root = fresh_copy('server')
        http_cc = root / 'src' / 'server' / 'http.cc'
        http_cc.write_text(http_cc.read_text().replace('#include "server/canvas.h"\n',
                                                       '#include "server/canvas.h"\n#include "api/model_impl.h"\n', 1))
        expect('internal include in the server, built on the facade', root, 1, 'src/server/http.cc:',
               '"api/model_impl.h"', 'public API')

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
