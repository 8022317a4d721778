"""Where a 125-key pool-hit lookup's time goes after the client sat idle: encoding the GET_MANY
messages, the burst (post, the server's answer, take), and decoding the replies into the
connector's location tuples, timed apart, for idle pauses of 0, 1 and 100 ms. The server
busy-polls (`--spin-after-ms 60000`), so the server's own wake-up is not in any figure: what grows
with the pause is this process's CPU coming back cold (on a VM: a vCPU that idled).

It uses the Python-level burst (`call_many`), so each phase can be timed apart; the connector's
lookup does the same three in one native call (`scripts/measure-lookup-fused.py`). Run from the
repository root:
PYTHONPATH=. python scripts/measure-lookup-cold.py [--rounds 40] [--pauses-ms 0,1,100]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" / "vllm_beluga"))

from belugactl.dataplane.rpc import protocol as p  # noqa: E402
from belugactl.dataplane.rpc.protocol import Op  # noqa: E402
from tests.support.mds_process import plugin_reader  # noqa: E402

NS = "measure"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--pauses-ms", default="0,1,100")
    args = ap.parse_args()
    pauses = [float(x) / 1e3 for x in args.pauses_ms.split(",")]
    with plugin_reader("scheduler", "--spin-after-ms", "60000", namespace=NS) as (index, keys):
        client = index._get_client()
        ns = client._ns_id(NS)
        per = p.get_many_capacity(client.transport.max_payload, len(keys[0]))
        chunks = [keys[i : i + per] for i in range(0, len(keys), per)]
        print(f"{len(keys)} keys in {len(chunks)} GET_MANY messages, server busy-polling; medians of {args.rounds}:")
        for pause in pauses:
            phases: dict[str, list[float]] = {"encode": [], "burst": [], "decode": [], "all": []}
            for _ in range(args.rounds):
                time.sleep(pause)
                t0 = time.perf_counter_ns()
                payloads = [p.encode_lookup(ns, chunk) for chunk in chunks]
                t1 = time.perf_counter_ns()
                replies = client._call_many(Op.GET_MANY, payloads)
                t2 = time.perf_counter_ns()
                located = [loc for reply in replies for loc in p.decode_get_many_tuples(reply)]
                t3 = time.perf_counter_ns()
                for name, a, b in (("encode", t0, t1), ("burst", t1, t2), ("decode", t2, t3), ("all", t0, t3)):
                    phases[name].append((b - a) / 1e3)
                assert len(located) == len(keys)
                index.release([loc[1] for loc in located])
            row = ", ".join(f"{name} {statistics.median(v):4.0f} us" for name, v in phases.items())
            print(f"  after {pause * 1e3:5.0f} ms idle: {row}")


if __name__ == "__main__":
    main()
