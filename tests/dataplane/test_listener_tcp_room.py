"""Who gives way at the TCP listener's cap (listener_tcp.TcpListener._make_room), on real socket pairs:
the oldest connection that has not settled, a silent one before one whose HELLO waits to be read; a
settled connection only when none is unsettled, and then only an idle one."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from belugactl.dataplane.mds.listener_tcp import _PROVING, TcpLimits, TcpListener, _Conn


@pytest.fixture
def room():  # noqa: ANN201
    lst = TcpListener.__new__(TcpListener)
    lst.server = SimpleNamespace(service=SimpleNamespace(forget_owner=lambda _o: None), selector=None)
    lst.limits = TcpLimits(max_connections=8)
    lst.conns, lst._backlog = {}, {}
    lst.displaced_unsettled = lst.refused_over_cap = lst.evicted_idle = 0
    peers: list[socket.socket] = []

    def add(since: float, *, settled: bool = False, says: bytes = b"", worked: bool = False) -> _Conn:
        ours, theirs = socket.socketpair()
        peers.append(theirs)
        if says:
            theirs.sendall(says)
        conn = _Conn(ours, len(lst.conns) + 1, since)
        conn.settled, conn.worked = settled, worked
        lst.conns[ours.fileno()] = conn
        return conn

    yield lst, add
    for s in peers:
        s.close()
    for c in list(lst.conns.values()):
        c.sock.close()


def test_the_oldest_silent_unsettled_connection_gives_way_whatever_its_age(room) -> None:  # noqa: ANN001
    lst, add = room
    tenant = add(0.0, settled=True, worked=True)
    hello_waiting = add(1.0, says=b"\x20\x00\x00\x00")  # the newcomer's HELLO, not read yet
    proving = add(1.5)
    proving.gate = _PROVING  # its handshake's challenge is out: the proof comes next
    silent_old, silent_new = add(2.0), add(3.0)
    assert lst._make_room(3.01)
    assert silent_old.sock.fileno() == -1 and lst.displaced_unsettled == 1 and lst.refused_over_cap == 1
    assert lst._make_room(3.02)
    assert silent_new.sock.fileno() == -1
    assert lst._make_room(3.03)  # only speaking ones are left unsettled: the oldest goes, not the tenant
    assert hello_waiting.sock.fileno() == -1 and proving.sock.fileno() != -1 and tenant.sock.fileno() != -1


def test_settled_connections_give_way_only_when_idle(room) -> None:  # noqa: ANN001
    lst, add = room
    worker = add(0.0, settled=True, worked=True)
    assert not lst._make_room(0.5)  # it worked less than evict_idle_after_s ago: nobody gives way
    assert lst._make_room(5.0) and worker.sock.fileno() == -1 and lst.evicted_idle == 1


def test_a_silent_arrival_takes_only_a_silent_ones_place(room) -> None:  # noqa: ANN001
    lst, add = room
    hello_waiting = add(1.0, says=b"\x20\x00\x00\x00")
    assert not lst._make_room(1.5, speaks=False)  # a silent arrival is closed: the newcomer keeps its place
    assert hello_waiting.sock.fileno() != -1 and lst.displaced_unsettled == 0
    silent = add(2.0)
    assert lst._make_room(2.5, speaks=False) and silent.sock.fileno() == -1 and hello_waiting.sock.fileno() != -1
    assert lst._make_room(3.0, speaks=True) and hello_waiting.sock.fileno() == -1  # one that speaks may


def test_the_listener_defers_accept_until_a_connection_speaks() -> None:
    """On the real listening socket: a client that sends at once is handed over at once, a silent one
    only after DEFER_ACCEPT_S (Linux's TCP_DEFER_ACCEPT; the order is what the cap's rule relies on)."""
    import selectors

    from belugactl.dataplane.mds.listener_tcp import DEFER_ACCEPT_S

    lst = TcpListener.__new__(TcpListener)
    sel = selectors.DefaultSelector()
    lst.server = SimpleNamespace(selector=sel, auth_required=lambda _b: False, rack_credential=lambda _r: None)
    lst.bind_address, lst.want_port = "127.0.0.1", 0
    lst.bind()
    assert lst.sock is not None
    silent = socket.create_connection(("127.0.0.1", lst.port))
    talker = socket.create_connection(("127.0.0.1", lst.port))
    talker.sendall(b"HELLO")
    try:
        assert sel.select(0.5), "the talking client was not handed over"
        first, _ = lst.sock.accept()
        first.settimeout(1)
        assert first.recv(5) == b"HELLO"  # not the silent one, which connected first
        first.close()
        assert not sel.select(DEFER_ACCEPT_S / 2)  # the silent one waits in the kernel
        assert sel.select(DEFER_ACCEPT_S * 4), "a silent connection must come through after the deferral"
        late, _ = lst.sock.accept()
        late.close()
    finally:
        silent.close()
        talker.close()
        sel.close()
        lst.sock.close()
