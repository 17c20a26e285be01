"""The engine's log messages (the "note:" lines) go to logging.getLogger("diffucoder"), not to stderr: here the
packed-weight cache's note when the cache cannot be written (its directory is a regular file), logged while the
model is destroyed with the GIL released, queued and forwarded. At interpreter exit, when Python can no longer
take it, the same note is printed on stderr, not lost."""

import gc
import logging
import os
import subprocess
import sys

import pytest

import diffucoder
from conftest import model_dir

NOTE = "the packed-weight cache was not written"


def packs_bf16_weights():
    """Whether this CPU (under DC_CPU_LEVEL's cap) packs bf16 weights, so that a weight cache is written."""
    if os.environ.get("DC_CPU_LEVEL", "") in ("baseline", "avx2", "avx512"):
        return False
    with open("/proc/cpuinfo") as f:
        return "avx512_bf16" in f.read()


needs_packing = pytest.mark.skipif(not packs_bf16_weights(), reason="no AVX512_BF16: bf16 weights are not packed")


@needs_packing
def test_unwritten_weight_cache_note_goes_to_the_diffucoder_logger(tmp_path, caplog, capfd):
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    caplog.set_level(logging.INFO, logger="diffucoder")
    model = diffucoder.AutoModel.from_pretrained(model_dir("tiny-gqa4-bf16"), weight_cache=str(not_a_dir), threads=2)
    assert not [r for r in caplog.records if NOTE in r.getMessage()]  # said when the model closes
    del model
    gc.collect()
    notes = [r for r in caplog.records if r.name == "diffucoder" and NOTE in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in caplog.records]
    assert notes[0].levelno == logging.WARNING
    assert NOTE not in capfd.readouterr().err  # not printed by the engine as well


@needs_packing
def test_note_at_interpreter_exit_is_printed_not_lost(tmp_path):
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    program = ("import sys, diffucoder\n"
               "model = diffucoder.AutoModel.from_pretrained(sys.argv[1], weight_cache=sys.argv[2], threads=2)\n")
    r = subprocess.run([sys.executable, "-c", program, model_dir("tiny-gqa4-bf16"), str(not_a_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(NOTE) == 1, r.stderr
