"""The two-host rack manifest `belugactl top`'s tests read (a file pool's geometry, real ports)."""

from __future__ import annotations


def top_rack(name: str, admin_port: int, port_base: int, router: str) -> str:
    """`router`: the serve section's router line (e.g. `router: {stats_port: 8404}`), or "" for none."""
    return f"""\
version: 1
name: {name}
pool:
  source: {{kind: cxl-region, memdevs: all, type: ram}}
  size: 64MiB
  align: 2MiB
layout:
  metadata: {{slots_per_ring: 8, slot_size: 256B, spare_rings: 2, journal: 2MiB}}
  shared_kv: 40MiB
  partition_size: equal
hosts:
  - {{name: h0, address: 127.0.0.1, roles: [metadata, worker], platform: gpu, numa: {{cpu_nodes: 1, cxl_nodes: 1}},
      gpus: {{count: 2, model: L40S}}}}
  - {{name: h1, address: 127.0.0.2, roles: [worker], platform: gpu, numa: {{cpu_nodes: 1, cxl_nodes: 1}},
      gpus: {{count: 2, model: L40S}}}}
serve:
  metadata: {{admin_port: {admin_port}}}
  {router}
  vllm: {{model: Qwen/Qwen2.5-7B-Instruct, instances_per_host: 2, port_base: {port_base}}}
"""
