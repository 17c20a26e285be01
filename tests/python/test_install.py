"""`pip install --no-build-isolation .` into a fresh venv (offline, Debian's setuptools), reusing the CMake
build directory as scripts/setup.sh does; the installed package imports and generates from outside the tree."""

import os
import subprocess
import sys

from conftest import BUILD, SOURCE


def test_pip_install_into_a_venv(tmp_path, tiny_gqa2):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = dict(os.environ, DC_CMAKE_BUILD_DIR=BUILD)
    env.pop("PYTHONPATH", None)
    r = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-q", SOURCE],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import diffucoder, torch; m = diffucoder.AutoModel.from_pretrained(%r, threads=1); "
            "print(diffucoder.__file__); print(m.diffusion_generate(torch.tensor([[1, 2]]), max_new_tokens=3, "
            "steps=3, seed=1).shape)" % tiny_gqa2)
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    where, shape = r.stdout.splitlines()
    assert where.startswith(str(venv)) and shape == "torch.Size([1, 5])"
