"""A small two-host rack manifest (64 MiB pool, 8 slots per ring): the pool, data-plane and hostile tests' rack."""

SMALL_RACK = """\
version: 1
name: dp-test
pool:
  source: {kind: cxl-region, memdevs: all, type: ram}
  size: 64MiB
  align: 2MiB
layout:
  metadata: {slots_per_ring: 8, slot_size: 256B, spare_rings: 2, journal: 2MiB}
  shared_kv: 40MiB
  partition_size: equal
hosts:
  - name: h0
    address: 10.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {cpu_nodes: 1, cxl_nodes: 1}
    gpus: {count: 2, model: L40S}
  - name: h1
    address: 10.0.0.2
    roles: [worker]
    platform: gpu
    numa: {cpu_nodes: 1, cxl_nodes: 1}
    gpus: {count: 2, model: L40S}
serve:
  vllm:
    model: Qwen/Qwen2.5-7B-Instruct
    instances_per_host: 2
"""
