"""Helpers shared by the tests, imported explicitly as `tests.support.<module>`; fixtures built on
them live in the conftest.py of the folder that uses them.

    paths             the repository, example manifests, the lab guest fixture tree
    manifests         example and minimal manifests, the broken-manifest corpus (model tests)
    fixture_trees     the captured host trees under tests/fixtures and their snapshots (discovery)
    doctor_snapshots  snapshots built in code for single doctor checks
    fake_machine      a stand-in machine (sysfs tree, kernel, tools) for setup tests
    small_rack        a small two-host rack manifest (pool, data-plane, hostile tests)
    lab               running the CLI against QEMU guests (lab-marked tests)
    needs             a tool a slow test needs: skipped where missing, failed under CI=true
    dashboard_names   metric names in the Grafana dashboard and in each exporter
    fake_service.py, router_backend.py   small HTTP servers the serve tests start as subprocesses
"""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
FAKE_SERVICE = SUPPORT / "fake_service.py"  # run as a script: `python fake_service.py PORT MODE [ARG]`
ROUTER_BACKEND = SUPPORT / "router_backend.py"  # run as a script: `python router_backend.py PORT NAME`
