"""One example per command, shown at the end of its `--help` (kept in one table so none is missing)."""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "discover": ["belugactl discover --json", "belugactl discover --capture support.tar.gz"],
    "doctor": ["belugactl doctor -f rack.yaml --host gpu01", "belugactl doctor --root support.tar.gz --json"],
    "plan": ["belugactl plan -f rack.yaml --host gpu01"],
    "setup": ["belugactl setup -f rack.yaml --dry-run", "belugactl setup -f rack.yaml --yes"],
    "teardown": ["belugactl teardown -f rack.yaml --dry-run"],
    "serve": [
        "belugactl serve -f rack.yaml --dry-run",
        "belugactl serve -f examples/cpu-demo.yaml --pool ~/beluga-cpu-demo.pool --detach",
    ],
    "status": ["belugactl status --json", "belugactl status -f rack.yaml"],
    "stop": ["belugactl stop"],
    "metadata-server": ["belugactl metadata-server -f rack.yaml --pool /dev/dax0.0"],
    "manifest check": ["belugactl manifest check -f examples/beluga-rack.yaml"],
    "manifest schema": ["belugactl manifest schema > rack.schema.json"],
    "pool show": ["belugactl pool show -f examples/lab.yaml --svg pool.svg"],
    "pool inspect": [
        "belugactl pool inspect /dev/dax0.0 -f rack.yaml",
        "belugactl pool inspect ~/beluga-cpu-demo.pool --json",
    ],
    "pool create-file": ["belugactl pool create-file -f examples/cpu-demo.yaml ~/beluga-cpu-demo.pool"],
    "pool members": [
        "belugactl pool members ~/rack.pool -f rack.yaml --dry-run",
        "belugactl pool members ~/rack.pool -f rack.yaml",
    ],
    "bench rpc": ["belugactl bench rpc --json", "belugactl bench rpc --lookup-keys 125 --idle-ms 0,1,100"],
    "bench mds": ["belugactl bench mds", "belugactl bench mds --idle --idle-rings 272"],
    "bench checksum": ["belugactl bench checksum", "belugactl bench checksum --quick --json"],
    "bench soak": ["belugactl bench soak --seconds 60 --writers 4 --readers 4 --json"],
    "bench kv": ["belugactl bench kv --blocks 64 --repeat 11"],
    "bench pool": ["belugactl bench pool --pool /dev/dax0.0 --read-only", "belugactl bench pool -f rack.yaml --json"],
    "bench failover": ["belugactl bench failover --kills 20 --blocks 100k,1M --json"],
    "bench overlap": ["belugactl bench overlap --lengths 4000 --rounds 3"],
    "pd-proxy": ["belugactl pd-proxy --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8101 --port 8090"],
    "bench serve": ["belugactl bench serve -f examples/cpu-demo.yaml --pool ~/beluga-cpu-demo.pool --create-pool"],
    "lab prepare": ["belugactl lab prepare --install"],
    "lab up": ["belugactl lab up --count 3", "belugactl lab up --profile pmem --ssh"],
    "lab status": ["belugactl lab status --json"],
    "lab exec": ["belugactl lab exec lab-1 -- belugactl doctor -f examples/lab-ram.yaml"],
    "lab selftest": ["belugactl lab selftest"],
    "lab ssh-config": ["belugactl lab ssh-config > lab.ssh && ssh -F lab.ssh lab-1 -- belugactl --version"],
    "lab restart": ["belugactl lab restart lab-2"],
    "lab down": ["belugactl lab down"],
    "lab coldstart": ["belugactl lab coldstart -f examples/lab-ram.yaml --keep"],
    "rack doctor": ["belugactl rack doctor -f examples/lab.yaml --transport lab"],
    "rack setup": ["belugactl rack setup -f rack.yaml --hosts 'gpu[01-16]' --dry-run"],
    "rack serve": ["belugactl rack serve -f rack.yaml --dry-run"],
    "rack status": ["belugactl rack status -f rack.yaml --json"],
    "rack stop": ["belugactl rack stop -f rack.yaml"],
    "export systemd": ["belugactl export systemd -f rack.yaml --host gpu01 -o /etc/systemd/system/"],
    "export prometheus": ["belugactl export prometheus -f rack.yaml -o prometheus.yml"],
    "export grafana": ["belugactl export grafana -f rack.yaml -o belugactl.json"],
    "top": ["belugactl top -f rack.yaml", "belugactl top -f rack.yaml --once --json"],
}


def _says_example(info) -> bool:
    text = info.help or (info.callback.__doc__ if info.callback else None) or ""
    return "Example:" in text or "Examples:" in text


def attach(app, prefix: str = "") -> list[str]:
    """Set each registered command's epilog from EXAMPLES; return the commands that have none."""
    missing: list[str] = []
    for info in app.registered_commands:
        name = prefix + (info.name or info.callback.__name__.replace("_", "-"))
        lines = EXAMPLES.get(name)
        if lines and _says_example(info):
            lines = None  # its help text shows one already: once is enough
        if lines and not info.epilog:
            # "\b" keeps click from re-wrapping the example lines
            info.epilog = "\b\nExample" + ("s" if len(lines) > 1 else "") + ":\n" + "\n".join(f"  {x}" for x in lines)
        elif name not in EXAMPLES and not info.epilog:
            missing.append(name)
    for group in app.registered_groups:
        if group.typer_instance is not None and group.name != "agent":
            missing += attach(group.typer_instance, prefix + group.name + " ")
    return missing
