"""The selftest's negative control: a topology known to drop writes must make it fail.

QEMU 7.2 drops every data write to a region when the CXL host bridge has a single root port. The
hidden `lab up --root-ports 1` builds exactly that; `lab selftest` has to say FAILED, or it proves nothing.
"""

import json
import os
import signal

import pytest

from belugactl.lab.paths import STATE_ENV
from tests.support.lab import our_qemus, run_cli, unavailable

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

LAB = "pytest-onerp"


def test_selftest_fails_loudly_when_writes_are_dropped(tmp_path):
    from belugactl.lab import kernel, prereqs
    from belugactl.lab.paths import cache_root

    missing = prereqs.check()
    if missing or kernel.find(cache_root()) is None:
        unavailable("qemu or the lab kernel (run `belugactl lab prepare`)")
    env = dict(os.environ, **{STATE_ENV: str(tmp_path)})
    try:
        up = run_cli(env, "lab", "up", "--profile", "pmem", "--name", LAB, "--hosts", "2", "--root-ports", "1",
                     timeout=600)
        assert up.returncode == 0, up.stderr
        st = run_cli(env, "lab", "selftest", "--name", LAB, "--json", timeout=600)
        assert st.returncode == 1
        assert "lab selftest FAILED" in st.stderr
        doc = json.loads(st.stdout)
        assert not doc["ok"] and doc["cleaned_up"]
        by_what = {c["what"]: c["ok"] for c in doc["checks"]}
        in_file = [ok for what, ok in by_what.items() if "in the pool file at" in what]
        across = [ok for what, ok in by_what.items() if " reads " in what]
        assert in_file == [False, False] and across == [False, False]
    finally:
        run_cli(env, "lab", "down", "--name", LAB, timeout=120)
        for pid in our_qemus(tmp_path):
            os.kill(pid, signal.SIGKILL)
