"""Builds diffucoder._core with CMake (the same libraries as the `diffucoder` binary) for `pip install .`.

    python3 -m venv --system-site-packages .venv      # sees Debian's numpy, torch, setuptools, pybind11
    .venv/bin/pip install --no-build-isolation .      # no network: Debian's build tools

    .venv/bin/pip wheel --no-build-isolation --no-deps -w dist .   # a wheel for other x86-64 machines

The build is portable by default (CMake's DC_NATIVE=OFF: the x86-64 baseline, the fast kernels picked at run
time by the CPU's features: AVX-512 / AVX512_BF16 / VNNI / AMX, else AVX2 + FMA), so a wheel built on one
machine runs on any x86-64 CPU (with the same Python and system libraries); DC_CPU_LEVEL caps the level at run time
(docs/dependencies.md "Build options").

Environment: DC_CMAKE_BUILD_DIR reuses an existing CMake build directory (e.g. build/, as scripts/setup.sh
does) instead of configuring a fresh one (its options stay as they are: a DC_NATIVE=ON directory makes a
wheel for this machine's CPU only, which is said on stderr); DC_CMAKE_ARGS adds CMake arguments to a fresh
one (e.g. "-DDC_NATIVE=ON" for -march=native).
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        build_dir = os.environ.get("DC_CMAKE_BUILD_DIR") or os.path.join(os.path.abspath(self.build_temp), "cmake")
        if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={sys.executable}", "-DDC_BUILD_TESTS=OFF",
                                   "-DDC_BUILD_BENCH=OFF"] + shlex.split(os.environ.get("DC_CMAKE_ARGS", "")))
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            if any(line.strip() in ("DC_NATIVE:BOOL=ON", "DC_NATIVE:BOOL=1", "DC_NATIVE:BOOL=TRUE") for line in f):
                print(f"setup.py: note: {build_dir} is configured with DC_NATIVE=ON (-march=native): this build "
                      "runs only on CPUs with this machine's instruction set", file=sys.stderr)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_core", "-j", str(os.cpu_count() or 1)])
        suffix = os.path.basename(target)[len("_core"):]
        built = os.path.join(build_dir, "python", "diffucoder", "_core" + suffix)
        if not os.path.isfile(built):
            found = glob.glob(os.path.join(build_dir, "python", "diffucoder", "_core*.so"))
            sys.exit(f"setup.py: {built} was not built (found {found}); the CMake build is for another Python "
                     f"than {sys.executable}?")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built, target)


setup(ext_modules=[Extension("diffucoder._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
