import io
import stat

import pytest

from belugactl.lab import cpio


def _archive(entries):
    buf = io.BytesIO()
    cpio.write(buf, entries)
    return buf.getvalue()


def test_round_trip_keeps_names_modes_data_and_device_numbers():
    entries = [
        cpio.directory("dev"),
        cpio.char_device("dev/console", 5, 1),
        cpio.file("init", b"#!/bin/sh\necho hi\n", 0o755),
        cpio.symlink("bin/sh", "busybox"),
        cpio.file("odd", b"x" * 5),  # a size that needs padding
    ]
    back = cpio.read(_archive(entries))
    assert [e.name for e in back] == ["dev", "dev/console", "init", "bin/sh", "odd"]
    console = back[1]
    assert stat.S_ISCHR(console.mode) and console.rdev == (5, 1)
    assert back[2].data == b"#!/bin/sh\necho hi\n" and back[2].mode & 0o777 == 0o755
    assert stat.S_ISLNK(back[3].mode) and back[3].data == b"busybox"
    assert back[4].data == b"xxxxx"


def test_every_header_starts_on_a_four_byte_boundary_and_ends_with_the_trailer():
    data = _archive([cpio.file("a", b"1"), cpio.file("bb", b"22"), cpio.file("ccc", b"333")])
    assert len(data) % 4 == 0
    positions = [i for i in range(len(data)) if data.startswith(b"070701", i)]
    assert len(positions) == 4  # three files and the trailer
    assert all(p % 4 == 0 for p in positions)
    assert b"TRAILER!!!\0" in data[positions[-1] :]


def test_same_inputs_give_the_same_bytes():
    entries = [cpio.file("x", b"abc")]
    assert _archive(entries) == _archive(entries)


def test_read_rejects_garbage():
    with pytest.raises(ValueError):
        cpio.read(b"not an archive" * 10)
