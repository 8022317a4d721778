"""One guest connection to a `lab up --host-port PORT` forward, joined to 127.0.0.1:PORT here.

QEMU's user network runs this for each TCP connection a guest opens to 10.0.2.100:PORT (a
`guestfwd=...-cmd:` rule; libslirp splits the command into words itself, no shell), with the guest's
end of the connection as stdin and stdout. It copies bytes both ways until either side is done.
Run as a script under `python -I -S`: the standard library only, nothing from belugactl.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

CHUNK = 65536


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit() or not 1 <= int(argv[1]) <= 65535:
        print("usage: host_forward.py PORT", file=sys.stderr)
        return 2
    try:
        upstream = socket.create_connection(("127.0.0.1", int(argv[1])), timeout=10)
    except OSError:
        return 1  # nothing listens there: the guest sees its connection closed
    upstream.settimeout(None)
    try:
        return _pump(upstream)
    except OSError:
        return 1  # either side went away mid-stream (a reset, a broken pipe): the other is closed on exit


def _pump(upstream: socket.socket) -> int:
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(upstream, selectors.EVENT_READ)
    guest_open = True
    while True:
        for key, _ in sel.select():
            if key.fileobj == 0:
                data = os.read(0, CHUNK)
                if not data:  # the guest is done sending: pass it on, keep reading the answer
                    sel.unregister(0)
                    guest_open = False
                    upstream.shutdown(socket.SHUT_WR)
                    continue
                upstream.sendall(data)
            else:
                data = upstream.recv(CHUNK)
                if not data:
                    return 0  # the service is done: exiting closes the guest's connection
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view) :]
        if not guest_open and not sel.get_map():
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
