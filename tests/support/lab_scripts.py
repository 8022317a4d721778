"""Small Python programs the lab tests run inside a guest with `python -c` (no files to copy in)."""

# Starts the server detached from the exec channel (own session, output to the share folder), so
# `lab exec` returns at once and the server outlives it.
LAUNCH = """
import subprocess, sys
log = open(sys.argv[1], "wb")
p = subprocess.Popen(sys.argv[3:], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                     start_new_session=True)
open(sys.argv[2], "w").write(str(p.pid))
print(p.pid)
"""

# Polls /readyz inside lab-1 (the admin HTTP is loopback-only there) until 200 or the deadline.
WAIT_READY = """
import json, sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
last = None
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
            print(json.dumps({"status": r.status, "body": json.loads(r.read())})); sys.exit(0)
    except Exception as exc:
        last = repr(exc)
    time.sleep(0.5)
print(json.dumps({"status": None, "error": last})); sys.exit(1)
"""

# Waits for a pid to be gone (or a zombie: the server's parent, the launcher, has exited).
WAIT_EXIT = """
import sys, time
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        state = open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        sys.exit(0)
    if state == "Z":
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
"""
