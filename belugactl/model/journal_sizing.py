"""How large the metadata journal must be to cover the pool: pure arithmetic, for the manifest's rule
(`layout.metadata.journal` against `layout.metadata.min_block`) and its default.

The journal (dataplane/mds/journal.py) keeps two halves; at a compaction the whole live index is
written into one half, so a half must hold one COMMIT record for every block the shared KV area can
hold at the smallest block size. A block of up to one allocator chunk (2 MiB) is one extent; larger
blocks take fewer records per byte, so the smallest block is the worst case. One record:
    8   record header (length, crc)
    1+2+ns  kind, namespace name (`<rack>@<16 hex layout id>@tp<rank>of<size>`, the connector's)
    2+32    key (vLLM's sha256 block hash)
    8+2+16  nbytes, extent count, one extent
    6       the CRC32C trailer
`tests/model/test_journal_sizing.py` checks this against the journal's own encoder.
"""

from __future__ import annotations

HEADER = 4096  # the journal area's header (magic, state word, fence line, stop record)
ORDER_RECORD = 8 + 17  # the first record of a half (journal.py _ORDER)
END_MARK = 8  # the zero length after a half's last record
KEY_BYTES = 32
LAYOUT_ID_CHARS = 16  # vllm_beluga/config.py layout_id
DEFAULT_MIN_BLOCK = 2 << 20  # one allocator chunk: an 8B-class model's 16-token block
DEFAULT_JOURNAL = 4 << 20  # the smallest journal the default gives (and what it was before the rule)


def namespace_bytes(rack_name: str, tp_size: int) -> int:
    """The longest namespace name the connector opens for this rack: `<rack>@<layout id>@tp<r>of<n>`."""
    n = max(1, tp_size)
    return len(rack_name.encode()) + 1 + LAYOUT_ID_CHARS + 3 + len(str(n - 1)) + 2 + len(str(n))


def record_bytes(ns_bytes: int, key_bytes: int = KEY_BYTES) -> int:
    return 8 + 1 + 2 + ns_bytes + 2 + key_bytes + 8 + 2 + 16 + 6


def journal_bytes(kv_bytes: int, min_block: int, ns_bytes: int) -> int:
    """The journal area that covers `kv_bytes` of KV blocks of `min_block` bytes each."""
    blocks = kv_bytes // min_block
    half = ORDER_RECORD + blocks * record_bytes(ns_bytes) + END_MARK
    return HEADER + 2 * half


def blocks_covered(journal: int, ns_bytes: int) -> int:
    """How many one-extent blocks a journal area of `journal` bytes holds in one half."""
    half = (journal - HEADER) // 2 - ORDER_RECORD - END_MARK
    return max(0, half // record_bytes(ns_bytes))


def covering_min_block(journal: int, kv_bytes: int, ns_bytes: int) -> int | None:
    """The smallest power-of-two block (>= 4 KiB) a journal of `journal` bytes covers the KV area at;
    None when it covers no block size up to the whole area."""
    covered = blocks_covered(journal, ns_bytes)
    if covered <= 0:
        return None
    block = 4 << 10
    while kv_bytes // block > covered:
        block <<= 1
        if block > max(kv_bytes, 4 << 10):
            return None
    return block


def default_journal(pool_bytes: int, min_block: int, ns_bytes: int, align: int) -> int:
    """The journal a manifest gets when it names none: covers the whole pool (an upper bound of the KV
    area) at `min_block`, at least DEFAULT_JOURNAL, a whole number of `align` units."""
    need = journal_bytes(pool_bytes, min_block, ns_bytes)
    if need <= DEFAULT_JOURNAL:
        return DEFAULT_JOURNAL  # the journal every manifest got before the rule: the layout hash stays
    return -(-need // align) * align
