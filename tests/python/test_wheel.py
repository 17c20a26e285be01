"""`pip wheel .` (offline: --no-build-isolation --no-deps, Debian's setuptools and wheel) reusing the CMake
build directory (DC_CMAKE_BUILD_DIR, so no second build), installed into a fresh venv, and a smoke subset of
these tests run against it from a directory outside the source tree (so only the wheel's package can be
imported). Also: the wheel's extension module uses AVX / AVX2 / AVX-512 instructions only in the kernels
picked at run time (namespace dc::cpu, and the avx2 / avx512 variants of core/kernel_variant.h), unless the build is DC_NATIVE=ON.
ctest `python_wheel` (tests/CMakeLists.txt); python_package leaves this file out."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import BUILD, FIXTURES, HERE, SOURCE

# Copied next to a conftest.py outside the tree and run with the venv's Python: the tokenizer, the forward
# against the PyTorch reference, generation against the reference fixtures (~10 s on 2 cores).
SMOKE = ["test_tokenizer.py", "test_forward.py", "test_generate.py::test_equals_reference_fixtures"]

# A VEX / EVEX encoded instruction in objdump's output: a ymm / zmm / k register, or an AVX-only mnemonic.
_VEX = re.compile(r"%[yz]mm\d|%k[0-7]\b|\tv[a-z0-9]+\s")
_FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def _run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _build_is_native(build_dir):
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        return any(line.strip() in ("DC_NATIVE:BOOL=ON", "DC_NATIVE:BOOL=1", "DC_NATIVE:BOOL=TRUE") for line in f)


def _dispatched(name):
    """Whether a function (objdump -C's label, a template's return type first) is a run-time dispatched
    kernel: in namespace dc::cpu (the fast kernels' target attributes, the AVX2 variant of the portable ones)
    but not its baseline variant, dc::cpu::baseline; or in a wider variant of core/kernel_variant.h elsewhere
    (dc::row_kernels::avx2, ::avx512: the sampler's row loops)."""
    head = name.split("(")[0]
    if "::baseline::" in head:
        return False
    return "dc::cpu::" in head or re.search(r"\bdc::(\w+::)+(avx2|avx512)::", head) is not None


def vector_functions_outside_dispatch(*paths):
    """Names of the functions in the objects / archives `paths` that use AVX or later instructions but are
    not dispatched kernels (_dispatched)."""
    bad = set()
    current = None
    proc = subprocess.Popen(["objdump", "-d", "-C", "--no-show-raw-insn", *paths], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        m = _FUNCTION.match(line)
        if m:
            current = m.group(1)
            continue
        if current is None or current in bad or not _VEX.search(line):
            continue
        if not _dispatched(current):
            bad.add(current)
    assert proc.wait(timeout=120) == 0
    return sorted(bad)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump (binutils)")
def test_only_dispatched_kernels_use_avx():
    """The wheel's module is stripped (its local functions have no names), so this reads the code it links,
    the layers' static libraries, with their symbols; and every compile command of the build for -m flags."""
    if _build_is_native(BUILD):
        pytest.skip(f"{BUILD} is configured with DC_NATIVE=ON (-march=native): not portable by choice")
    with open(os.path.join(BUILD, "compile_commands.json")) as f:
        commands = json.load(f)
    isa = [c["file"] for c in commands if re.search(r"\s-m(arch|avx|fma|f16c|sse4|bmi)", c["command"])]
    assert not isa, f"compiled with an ISA flag in a portable build: {isa[:5]}"
    libraries = sorted(glob.glob(os.path.join(BUILD, "libdc_*.a")))
    assert any(p.endswith("libdc_ops.a") for p in libraries), libraries
    bad = vector_functions_outside_dispatch(*libraries)
    assert not bad, f"{len(bad)} functions outside the run-time dispatch use AVX or later, e.g. {bad[:10]}"


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump (binutils)")
def test_the_check_finds_avx_outside_the_dispatch(tmp_path):
    """The check above can fail: a function compiled with -mavx2 is reported, the same in dc::cpu::avx2 or a
    layer's variant namespace (dc::row_kernels::avx512) is not, and in a baseline variant it is."""
    for ns, flags, expect_bad in (("dc", ["-mavx2"], True), ("dc", [], False), ("dc::cpu::avx2", ["-mavx2"], False),
                                  ("dc::cpu::baseline", ["-mavx2"], True), ("dc::row_kernels::avx512", ["-mavx2"], False),
                                  ("dc::row_kernels::baseline", ["-mavx2"], True), ("dc::avx2", ["-mavx2"], True)):
        src = tmp_path / "f.cc"
        src.write_text(f"namespace {ns} {{ void scale(float* x, int n) {{ for (int i = 0; i < n; ++i) x[i] *= 3.0f; }} }}\n")
        obj = tmp_path / "f.o"
        _run(["c++", "-O3", "-c", str(src), "-o", str(obj), *flags], timeout=60)
        assert bool(vector_functions_outside_dispatch(str(obj))) == expect_bad, (ns, flags)


def test_wheel_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], timeout=120)
    python = str(venv / "bin" / "python")
    env = dict(os.environ, DC_CMAKE_BUILD_DIR=BUILD)
    env.pop("PYTHONPATH", None)
    wheels = tmp_path / "wheels"
    _run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-q", "-w", str(wheels),
          SOURCE], env=env, timeout=300)
    (wheel,) = [str(p) for p in wheels.iterdir() if p.suffix == ".whl"]
    assert re.match(r"diffucoder-0\.1\.0-cp3\d+-cp3\d+-linux_x86_64\.whl$", os.path.basename(wheel)), wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert "diffucoder/__init__.py" in names and any(re.match(r"diffucoder/_core.*\.so$", n) for n in names), names
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], env=env, timeout=300)

    smoke = tmp_path / "smoke"  # outside the source tree: only the wheel's package can be imported
    smoke.mkdir()
    for name in {s.split("::")[0] for s in SMOKE} | {"conftest.py"}:
        shutil.copy(os.path.join(HERE, name), smoke / name)
    (smoke / "test_imported_from_the_wheel.py").write_text(
        "import diffucoder, os\n"
        "def test_imported_from_the_venv():\n"
        f"    assert os.path.realpath(diffucoder.__file__).startswith(os.path.realpath({str(venv)!r}))\n"
        f"    assert not os.path.realpath(diffucoder.__file__).startswith(os.path.realpath({SOURCE!r}) + os.sep)\n")
    env.update(DC_SOURCE_DIR=SOURCE, DC_BUILD_DIR=BUILD, DC_FIXTURES_DIR=FIXTURES,
               DC_BINARY_PATH=os.path.join(BUILD, "diffucoder"))
    r = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(smoke),
                        "test_imported_from_the_wheel.py", *SMOKE], cwd=str(smoke), env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    assert re.search(r"\b\d+ passed\b", r.stdout) and "skipped" not in r.stdout, r.stdout[-2000:]
