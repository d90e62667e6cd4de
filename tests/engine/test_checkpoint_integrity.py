"""A checkpoint whose bytes changed after they were written (a flipped bit on disk or on the way between machines)
is refused in one sentence, not resumed into a silently different run: torch.load does not check the CRC-32 of the
zip records torch.save writes, so load_checkpoint does."""

import os
import zipfile

import pytest
import torch

from hasfl_ray.engine import RunConfig
from hasfl_ray.engine import rundir as rundir_module
from hasfl_ray.engine.checkpoint import Checkpoint, checkpoint_path, load_checkpoint, save_checkpoint
from hasfl_ray.errors import ConfigError


def _checkpoint():
    history = [{**dict.fromkeys(rundir_module.METRIC_KEYS, 0.0), "round": r} for r in range(2)]
    return Checkpoint(round=2, params={"w": torch.arange(4096, dtype=torch.float32)}, algorithm_state={"r": 2},
                      history=history, config=RunConfig(backend="local").to_dict(), elapsed_s=1.0)


def _flip_a_byte_of(path, record_suffix):
    """Flip one byte in the middle of the stored (uncompressed) bytes of the archive record ending in
    ``record_suffix``; return the record's name."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(record_suffix))
    data = bytearray(open(path, "rb").read())
    name_length = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    extra_length = int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_length + extra_length
    data[start + info.compress_size // 2] ^= 0x40
    with open(path, "wb") as handle:
        handle.write(bytes(data))
    return info.filename


def test_a_flipped_byte_inside_a_tensor_is_one_sentence_not_a_different_resume(tmp_path):
    save_checkpoint(str(tmp_path), _checkpoint())
    path = checkpoint_path(str(tmp_path))
    record = _flip_a_byte_of(path, "data/0")
    # The premise: torch.load itself reads the damaged file without a word, one parameter changed.
    loaded = torch.load(path, weights_only=True)
    assert not torch.equal(loaded["params"]["w"], torch.arange(4096, dtype=torch.float32))
    with pytest.raises(ConfigError) as refused:
        load_checkpoint(str(tmp_path))
    message = str(refused.value)
    assert message == (f"checkpoint {path!r} cannot be read (it is corrupt: the bytes of its record {record!r} fail "
                       "the CRC-32 check written with them); expected a whole hasfl-ray checkpoint, or force=True "
                       "without resume=True to start again")  # called from Python: the API's keywords


def test_an_intact_checkpoint_passes_the_check(tmp_path):
    save_checkpoint(str(tmp_path), _checkpoint())
    assert torch.equal(load_checkpoint(str(tmp_path)).params["w"], torch.arange(4096, dtype=torch.float32))
    assert os.listdir(os.path.dirname(checkpoint_path(str(tmp_path)))) == ["latest.pt"]


def test_the_crc_32s_are_written_even_where_the_process_turned_them_off(tmp_path):
    """torch.serialization.set_crc32_options(False) (a plug-in's or a script's, process-wide) writes every CRC as 0;
    save_checkpoint writes them anyway, so its checkpoint is not refused as damaged on resume, and leaves the option
    as it found it."""
    torch.serialization.set_crc32_options(False)
    try:
        save_checkpoint(str(tmp_path), _checkpoint())
        assert torch.serialization.get_crc32_options() is False
    finally:
        torch.serialization.set_crc32_options(True)
    with zipfile.ZipFile(checkpoint_path(str(tmp_path))) as archive:
        assert archive.testzip() is None and all(info.CRC for info in archive.infolist())
    assert load_checkpoint(str(tmp_path)).round == 2
