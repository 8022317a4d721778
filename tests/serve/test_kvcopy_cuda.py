"""The CUDA path of the KV copy engine (marker `gpu`: runs only where torch sees a GPU; see scripts/gpu-check)."""

from __future__ import annotations

import mmap

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA device", allow_module_level=True)
pytest.importorskip("triton")

from belugactl.dataplane.kvcopy import KVBlockLayout, TensorView  # noqa: E402
from belugactl.dataplane.kvcopy_cuda import CudaKVCopyEngine  # noqa: E402

BLOCKS, LAYERS, PIECE = 16, 4, 32 * 1024


@pytest.fixture
def setup():
    kv = torch.randint(0, 255, (LAYERS, 2, BLOCKS, PIECE), dtype=torch.uint8, device="cuda")
    views = [
        TensorView(f"l{i}", kv[i].data_ptr(), (BLOCKS, 2, PIECE), (PIECE, BLOCKS * PIECE, 1), 1, "uint8", "cuda")
        for i in range(LAYERS)
    ]
    layout = KVBlockLayout.from_views(views)
    pool = mmap.mmap(-1, 64 * layout.block_nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    engine = CudaKVCopyEngine(layout, pool)
    yield kv, layout, pool, engine
    engine.close()


def _block(kv, b: int) -> bytes:
    return b"".join(bytes(kv[i, h, b].cpu().numpy()) for i in range(LAYERS) for h in (0, 1))


def test_save_packs_every_piece_of_a_block_in_layer_order(setup) -> None:
    kv, layout, pool, engine = setup
    n = layout.block_nbytes
    assert engine.save([(3, [(5 * n, n)]), (9, [(0, n // 2), (7 * n, n // 2)])]) == 2 * n
    assert pool[5 * n : 6 * n] == _block(kv, 3)
    assert pool[0 : n // 2] + pool[7 * n : 7 * n + n // 2] == _block(kv, 9)


def test_load_round_trips_into_other_blocks(setup) -> None:
    kv, layout, pool, engine = setup
    n = layout.block_nbytes
    want = _block(kv, 2)
    engine.save([(2, [(n, n)])])
    kv[:, :, 11].zero_()
    engine.load([(11, [(n, n)])])
    assert _block(kv, 11) == want
