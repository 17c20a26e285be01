"""Shared fixtures of the Python package tests (ctest `python_package`): the tiny checkpoints the PyTorch
reference writes (ctest fixture reference_fixtures), the `diffucoder` binary, the reference itself."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("DC_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BUILD = os.environ.get("DC_BUILD_DIR", os.path.join(SOURCE, "build"))
FIXTURES = os.environ.get("DC_FIXTURES_DIR", os.path.join(BUILD, "fixtures"))
BINARY = os.environ.get("DC_BINARY_PATH", os.path.join(BUILD, "diffucoder"))
sys.path.insert(0, os.path.join(SOURCE, "tests", "reference"))


def model_dir(name):
    path = os.path.join(FIXTURES, name)
    if not os.path.isfile(os.path.join(path, "config.json")):
        pytest.fail(f"{path}: missing; run the reference_fixtures ctest test first")
    return path


def reference_cases(name, kind="generate"):
    with open(os.path.join(model_dir(name), "reference", kind + ".json")) as f:
        return json.load(f)


def run_cli(*args, timeout=120):
    """Runs the diffucoder binary; returns stdout, failing the test with stderr on a non-zero exit."""
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        pytest.fail(f"diffucoder {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r.stdout


@pytest.fixture(scope="session")
def tiny_vocab():
    return model_dir("tiny-vocab")


@pytest.fixture(scope="session")
def tiny_gqa2():
    return model_dir("tiny-gqa2")
