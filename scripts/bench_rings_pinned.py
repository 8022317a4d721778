"""`bench mds --scale`'s ring part (one busy client on ring 0: QD1 lookup p50, QD128 in C, the server's
idle look) with the server pinned to CPU 0 and the client to CPU 1, so that on a shared 2-core machine
the two do not take turns on one core (unpinned, one configuration's medians ranged 1.4 to 1,600 us).

    PYTHONPATH=<tree> .venv/bin/python scripts/bench_rings_pinned.py 16,128,512,1152 [samples]

Run it on two trees back to back (a `git worktree` at the commit before, one after) and compare.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

from belugactl.pool.file_pool import create_file_pool
from belugactl.workflows.bench import mds_scale as m
from belugactl.workflows.bench.server import bench_rack, running_server

rings = [int(x) for x in sys.argv[1].split(",")]
samples = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
with tempfile.TemporaryDirectory() as tmp_name:
    tmp = Path(tmp_name)
    for count in rings:
        manifest = tmp / f"rings-{count}.yaml"
        manifest.write_text(bench_rack(spare_rings=count - m.PROCESS_RINGS, slots_per_ring=m.SLOTS_PER_RING))
        pool = create_file_pool(tmp / f"rings-{count}.pool", manifest)
        doc: dict = {"rings": count}
        old = os.sched_getaffinity(0)
        with running_server(manifest, pool, cpu=0) as srv:
            os.sched_setaffinity(0, {1})
            for mode in ("none", "flush"):
                doc[mode] = m._ring_mode(pool, mode == "flush", samples)
                doc[mode]["pass_us"] = m._dig(m._stats(srv["admin"]), m.SERVER_RING_PASS_US)
        os.sched_setaffinity(0, old)
        pool.unlink()
        print(json.dumps(doc), flush=True)
