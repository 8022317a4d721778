"""Only for tests/dataplane/test_rpc_lab.py, which still imports `lab_support` through a sys.path insert.

Delete this file once that test imports `from tests.support.lab import ...` like every other lab test.
"""

from tests.support.lab import REPO, our_qemus, run_cli, unavailable

__all__ = ["REPO", "our_qemus", "run_cli", "unavailable"]
