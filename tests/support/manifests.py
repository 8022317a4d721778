from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BROKEN = REPO / "tests" / "manifests" / "broken"

# A small valid manifest the tests vary; positions in it do not matter to any test.
MINIMAL = """\
version: 1
name: t
pool:
  source:
    kind: cxl-region
    memdevs: all
  size: 510MiB
  namespace:
    uuid: 1c3e5a7b-9d2f-4e61-8a0b-c4d6e8f0a2b3
    name: t
layout:
  shared_kv: 254MiB
  partition_size: equal
hosts:
  - name: h1
    address: 10.0.0.1
    roles: [metadata, worker]
    platform: cpu
  - name: h2
    address: 10.0.0.2
    platform: cpu
"""
