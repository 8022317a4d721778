"""`serve`, `status`, `stop`: the metadata server and vLLM instances of one host, supervised.

- plan.py: the exact processes (argv, environment, ports, logs) from the manifest
- preflight.py: vLLM present, model present, ports free, pool provisioned, doctor gate
- supervisor.py: start in order, readiness, restart with backoff, clean stop, state file
- control.py: prepare a plan for a host, `status` and `stop` from the state file
"""
