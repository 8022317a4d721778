"""What runs inside a lab guest, started there by argv (never imported by the host side of `belugactl.lab`).

- `agent.py`: the guest agent (`/init` starts it as a script; standard library only).
- `daxpoke.py`: reads and writes a dax device for the selftests and lab tests (standard library only).
- `resident_cli.py`: the resident CLI, a belugactl that has imported the CLI once and forks per command.
- `rpc_driver.py`: one KV-index client's round trips with every byte checked (the cross-host RPC test).

Code here may import `cli/`, `dataplane/`, `pool/` and the leaf modules, like an operator's process on a
real host (see docs/architecture.md, "Layers and what each may import").
"""
