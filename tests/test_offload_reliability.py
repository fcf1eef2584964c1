"""An offload folder that fails under a running model (deleted, cut short, full): the words go on, or one line
naming the folder; never a traceback from the layer store."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import asr.models.layer_store
from asr.models.offload import OffloadError, OffloadOptions, offload_store
from asr.models.registry import load_model
from asr.options import TranscribeOptions
from asr.transcription import transcribe
from tests import test_offload

# The fixtures and command runner of the offload tests.
in_memory, noise, noise_file = test_offload.in_memory, test_offload.noise, test_offload.noise_file
_run = test_offload._run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("reader", ["read", "mmap"])
def test_a_folder_deleted_mid_run_takes_nothing_the_store_reads(tiny_whisper_folder: Path, in_memory,
                                                                noise: np.ndarray, tmp_path: Path, reader: str) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk", folder=str(tmp_path),
                                                                            reader=reader))
    shutil.rmtree(tmp_path)  # a cleaner of /tmp, or a user, while the model is loaded
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=40, word_timestamps=True)
    got = transcribe(offloaded, noise, options)  # word timestamps run module forwards through the hooks
    expected = transcribe(in_memory, noise, options)
    assert [s.tokens for s in got.segments] == [s.tokens for s in expected.segments]
    assert [(w.word, w.start) for s in got.segments for w in s.words] == \
           [(w.word, w.start) for s in expected.segments for w in s.words]


@pytest.mark.parametrize("reader", ["read", "mmap", "accelerate"])
def test_a_layer_file_cut_short_is_one_line_naming_the_folder(tiny_whisper_folder: Path, noise: np.ndarray,
                                                              tmp_path: Path, reader: str) -> None:
    offloaded = load_model(str(tiny_whisper_folder), offload=OffloadOptions("disk", folder=str(tmp_path),
                                                                            reader=reader, prefetch=False))
    layer = offload_store(offloaded.model).layers[1]
    os.truncate(layer.path, layer.start + layer.nbytes // 2)
    options = TranscribeOptions(language="en", temperatures=(0.0,), max_new_tokens=40)
    with pytest.raises(OffloadError, match=r"cannot read layer_1.safetensors from offload folder .*asr-offload-"):
        transcribe(offloaded, noise, options)


def test_a_folder_without_room_is_one_line_before_any_write(tiny_whisper_folder: Path, noise_file: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    result = _run(str(noise_file), "--model", str(tiny_whisper_folder), "--offload", "disk",
                  "--offload-folder", str(tmp_path))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith(
        f"Error: offload folder {tmp_path} has 0MB free and the offloaded layers need")
    assert list(tmp_path.iterdir()) == []  # its own folder went with the failed load


def test_a_folder_that_fills_up_while_written_is_one_line(tiny_whisper_folder: Path, noise_file: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args, **kwargs):  # another writer took the room between the check and the write
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(asr.models.layer_store, "save_file", full)
    result = _run(str(noise_file), "--model", str(tiny_whisper_folder), "--offload", "disk",
                  "--offload-folder", str(tmp_path))
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert re.fullmatch(f"Error: cannot write the layer files to offload folder {re.escape(str(tmp_path))}/asr-offload-"
                        r"\w+: no space left on the device; free some or give --offload-folder on a larger disk", last)
    assert list(tmp_path.iterdir()) == []  # the partly written folder is gone at once
