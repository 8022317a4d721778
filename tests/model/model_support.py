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
    uuid: 5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01
    name: t
layout:
  shared_kv: 254MiB
hosts:
  - name: h1
    address: 10.0.0.1
    roles: [metadata, worker]
    platform: cpu
  - name: h2
    address: 10.0.0.2
    platform: cpu
"""


