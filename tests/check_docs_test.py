#!/usr/bin/env python3
"""Self-test of scripts/check_docs.py: on a copy of the docs with an unknown flag, a broken link and a failing
demo block planted, the check fails naming each (so that its pass on the real docs means something).

Usage: tests/check_docs_test.py BINARY SOURCE_DIR MODEL_DIR
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile


def main():
    binary, source, model_dir = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        # (the real demo blocks unmarked: check_docs runs them; here only the planted one runs)
        readme = (source / "README.md").read_text(encoding="utf-8")
        (root / "README.md").write_text(readme.replace("<!-- runs on the demo model -->", ""), encoding="utf-8")
        shutil.copy(source / "BENCHMARKS.md", root)
        shutil.copytree(source / "docs", root / "docs")
        with open(root / "docs" / "generate.md", "a", encoding="utf-8") as f:
            f.write("\n```\ndiffucoder generate --model DIR --stepz 3\n```\nSee [the guide](missing-guide.md).\n"
                    "<!-- runs on the demo model -->\n```sh\nbuild/diffucoder inspect --model DIR/missing\n```\n")
        r = subprocess.run([sys.executable, str(source / "scripts" / "check_docs.py"), binary, str(root),
                            "--demo", model_dir], capture_output=True, text=True)
    expected = ["`diffucoder generate` has no flag --stepz", "link to a missing file: missing-guide.md",
                "the demo block failed, exit 1"]
    missing = [e for e in expected if e not in r.stdout]
    if r.returncode != 1 or missing:
        print(f"check_docs_test: exit {r.returncode}, missing {missing}\n{r.stdout}{r.stderr}")
        return 1
    print("check_docs_test: the planted flag, link and demo block were reported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
