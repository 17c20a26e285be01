#!/usr/bin/env python3
"""Self-test of scripts/check_docs.py: on a copy of the docs with one unknown flag and one broken link planted,
the check fails naming both (so that its pass on the real docs means something).

Usage: tests/check_docs_test.py BINARY SOURCE_DIR
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile


def main():
    binary, source = sys.argv[1], pathlib.Path(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        shutil.copy(source / "README.md", root)
        shutil.copy(source / "BENCHMARKS.md", root)
        shutil.copytree(source / "docs", root / "docs")
        with open(root / "docs" / "generate.md", "a", encoding="utf-8") as f:
            f.write("\n```\ndiffucoder generate --model DIR --stepz 3\n```\nSee [the guide](missing-guide.md).\n")
        r = subprocess.run([sys.executable, str(source / "scripts" / "check_docs.py"), binary, str(root)],
                           capture_output=True, text=True)
    expected = ["`diffucoder generate` has no flag --stepz", "link to a missing file: missing-guide.md"]
    missing = [e for e in expected if e not in r.stdout]
    if r.returncode != 1 or missing:
        print(f"check_docs_test: exit {r.returncode}, missing {missing}\n{r.stdout}{r.stderr}")
        return 1
    print("check_docs_test: the planted flag and link were reported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
