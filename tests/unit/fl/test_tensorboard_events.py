"""atoll's own TensorBoard event files: read back by TensorBoard's reader, and no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

from atoll.fl.tensorboard_events import EventFileWriter, crc32c

importlib.import_module("tensorboard")  # required: its reader is the check


def _read(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return events


def test_crc32c_is_castagnolis():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert crc32c(b"") == 0


def test_tensorboard_reads_every_scalar_with_its_step_and_time(tmp_path):
    writer = EventFileWriter(tmp_path / "tb")
    writer.add_scalars({"train/loss/a": 1.5, "validate/accuracy/global": 0.25}, 1, 1000.5)
    writer.add_scalars({"train/loss/a": 0.75}, 2, 1001.0)
    writer.add_scalars({"epoch_loss/b": -2.0}, -3, 1002.0)  # a script's own (negative) step
    writer.add_scalars({"unicode/é": 3.0}, 2**40, 1003.0)
    writer.close()
    assert writer.path.name.startswith("events.out.tfevents.")
    events = _read(tmp_path / "tb")
    assert sorted(events.Tags()["scalars"]) == ["epoch_loss/b", "train/loss/a", "unicode/é",
                                                "validate/accuracy/global"]
    assert [(e.step, e.value, e.wall_time) for e in events.Scalars("train/loss/a")] == [
        (1, 1.5, 1000.5), (2, 0.75, 1001.0)]
    assert [(e.step, e.value) for e in events.Scalars("epoch_loss/b")] == [(-3, -2.0)]
    assert [e.step for e in events.Scalars("unicode/é")] == [2**40]
    assert events.Scalars("validate/accuracy/global")[0].value == 0.25


def test_a_corrupted_record_is_not_read_as_valid(tmp_path):
    writer = EventFileWriter(tmp_path / "tb")
    writer.add_scalars({"x": 1.0}, 1, 1000.0)
    writer.close()
    data = bytearray(writer.path.read_bytes())
    data[-6] ^= 0xFF  # inside the last record's payload: its CRC no longer matches
    writer.path.write_bytes(bytes(data))
    assert "x" not in _read(tmp_path / "tb").Tags()["scalars"]


def test_the_tracker_imports_neither_torch_nor_tensorboard(tmp_path):
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from atoll.fl.tracking import Record, tensorboard_tracker\n"
        f"t = tensorboard_tracker(Path({str(tmp_path / 'tb')!r}), None)\n"
        "t.log(Record(1, 'train', 'a', {'loss': 1.0}))\n"
        "t.close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'tensorboard', 'numpy')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
    assert _read(tmp_path / "tb").Scalars("train/loss/a")[0].value == 1.0
