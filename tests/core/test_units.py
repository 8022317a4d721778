import pytest

from belugactl.units import GiB, MiB, SizeParseError, TiB, align_up, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2MiB", 2 * MiB),
        ("2M", 2 * MiB),
        ("8TiB", 8 * TiB),
        ("536870912", 536870912),
        (536870912, 536870912),
        ("1.5GiB", 3 * GiB // 2),
        ("1GB", 10**9),
        (" 4 KiB ", 4096),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "MiB", "2XiB", "-1", "1.3B", True, None, 2.5, -5])
def test_parse_size_rejects(bad):
    with pytest.raises(SizeParseError):
        parse_size(bad)


def test_format_size():
    assert format_size(2 * MiB) == "2 MiB"
    assert format_size(8 * TiB) == "8 TiB"
    assert format_size(3 * GiB // 2) == "1.50 GiB"
    assert format_size(512) == "512 B"


def test_align_up():
    assert align_up(1, 2 * MiB) == 2 * MiB
    assert align_up(2 * MiB, 2 * MiB) == 2 * MiB
    assert align_up(0, 2 * MiB) == 0
