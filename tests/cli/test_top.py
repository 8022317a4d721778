"""`belugactl top` without a terminal: recorded /metrics answers (tests/fixtures/metrics/) parsed,
turned into rates over an interval, sorted, filtered and drawn at 80 columns; the CLI's --once and
--json against those answers served over real HTTP sockets (threads in this process).

The live screen under a real terminal is tests/serve/test_top_tmux.py."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from belugactl.workflows.export_prometheus import Target
from belugactl.workflows.top.live import run_live, split_keys
from belugactl.workflows.top.model import build_snapshot, quantile
from belugactl.workflows.top.prom_text import NotPrometheusText, parse
from belugactl.workflows.top.scrape import Round, Scrape, fetch, reason
from belugactl.workflows.top.view import fmt_bytes, plain, render_lines
from belugactl.workflows.top.view_state import ViewState, press, visible
from tests.support.top_rack import top_rack

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MDS = Target("beluga-metadata", "127.0.0.1:9470", "h0", "metadata-server")
ROUTER = Target("beluga-router", "127.0.0.1:8404", "h0", "h0-router")
VLLM = [Target("beluga-vllm", f"10.0.0.{h + 1}:{8000 + i}", f"h{h}", f"h{h}-vllm-{i}") for h in (0, 1) for i in (0, 1)]
ENDPOINTS = [MDS, *VLLM, ROUTER]


def recorded(name: str) -> str:
    return (METRICS / name).read_text()


def a_round(at: float, which: str, *, down: dict[str, str] | None = None) -> Round:
    """The rack as recorded: the server and h0-vllm-0 answer (scrape `which`), the router answers,
    the other instances are down with the reason given (connection refused by default)."""
    down = down if down is not None else {}
    scrapes = {
        MDS.name: Scrape(MDS, parse(recorded(f"metadata-server-{which}.prom"))),
        ROUTER.name: Scrape(ROUTER, parse(recorded("haproxy.prom"))),
        VLLM[0].name: Scrape(VLLM[0], parse(recorded(f"vllm-{which}.prom"))),
    }
    for t in VLLM[1:]:
        scrapes[t.name] = Scrape(t, None, down.get(t.name, "connection refused"))
    return Round(at, 1_800_000_000.0 + at, scrapes)


def snapshot(**kw):  # type: ignore[no-untyped-def]
    return build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, a_round(10.0, "a", **kw), a_round(12.0, "b", **kw))


# --- parsing ---------------------------------------------------------------------------------------


def test_a_recorded_metadata_server_scrape_parses_into_its_figures():
    m = parse(recorded("metadata-server-b.prom"))
    assert m.total("beluga_mds_entries") == 100
    assert m.total("beluga_mds_pool_bytes", state="used") == 1_310_720
    assert m.total("beluga_mds_pool_bytes", state="capacity") == 40 * 1024 * 1024
    assert m.total("beluga_mds_hits_total") == 130
    assert m.total("beluga_mds_requests_total") == 492  # cxl + tcp, summed over the label
    assert m.total("no_such_metric") is None
    buckets = m.buckets("beluga_mds_request_seconds")  # summed over every op
    assert buckets[-1] == (float("inf"), 492.0)


@pytest.mark.parametrize("text", ["<html><body>Bad Gateway</body></html>", '{"error": "not found"}', "a b c d\n"])
def test_an_answer_that_is_not_prometheus_text_is_refused(text):
    with pytest.raises(NotPrometheusText, match="not Prometheus text"):
        parse(text)


# --- rates and health --------------------------------------------------------------------------------


def test_the_metadata_server_rates_come_from_two_scrapes_over_the_interval():
    md = snapshot().metadata
    assert md is not None and md.state == "up" and md.epoch == 1 and not md.restarted
    assert md.entries == 100 and md.used_bytes == 1_310_720
    # a: 30 hits, 10 misses; b: 130 hits, 30 misses: 100 of 120 in the interval
    assert md.hit_rate == pytest.approx(100 / 120)
    assert md.lookups_per_s == pytest.approx(120 / 2.0)
    assert md.saved_bytes_per_s == pytest.approx((1_310_720 - 327_680) / 2.0)
    assert md.loaded_bytes_per_s == pytest.approx((1_556_480 - 245_760) / 2.0)
    assert md.evictions == 0 and md.evictions_per_s == 0
    assert md.p50_s is not None and md.p99_s is not None and 0 < md.p50_s <= md.p99_s < 0.1


def test_with_one_scrape_there_are_gauges_but_no_rates():
    snap = build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, None, a_round(0.0, "b"))
    md = snap.metadata
    assert md is not None and md.entries == 100
    assert md.hit_rate is None and md.saved_bytes_per_s is None and md.p50_s is None
    assert snap.interval_s is None
    assert snap.instances[0].running == 3 and snap.instances[0].loaded_bytes_per_s is None


def test_a_counter_that_went_down_was_reset_and_its_new_value_is_the_increase():
    before = a_round(0.0, "b")
    after = a_round(1.0, "a")  # every counter lower: the server restarted (same epoch number here)
    md = build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, before, after).metadata
    assert md is not None
    assert md.saved_bytes_per_s == pytest.approx(327_680)  # a's whole count, in one second
    assert md.hit_rate == pytest.approx(30 / 40)


def test_a_new_epoch_is_a_restart_and_the_interval_has_no_rates():
    before = a_round(0.0, "a")
    text = recorded("metadata-server-b.prom").replace("beluga_mds_epoch 1.0", "beluga_mds_epoch 2.0")
    after = a_round(1.0, "b")
    after.scrapes[MDS.name] = Scrape(MDS, parse(text))
    md = build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, before, after).metadata
    assert md is not None and md.restarted and md.epoch == 2
    assert md.hit_rate is None and md.saved_bytes_per_s is None


def test_an_instance_rates_hit_rate_and_lookup_latency():
    inst = snapshot().instances[0]
    assert inst.name == "h0-vllm-0" and inst.state == "up"
    assert inst.hit_rate == pytest.approx(2048 / 4096)  # pool tokens hit / queried in the interval
    assert inst.loaded_bytes_per_s == pytest.approx((83_886_080 - 50_331_648) / 2.0)
    assert inst.saved_bytes_per_s == pytest.approx((109_051_904 - 100_663_296) / 2.0)
    assert inst.lookup_s == pytest.approx((0.0019 - 0.0011) / (20 - 12))
    assert (inst.running, inst.waiting) == (3, 1)


def test_hosts_routers_and_down_instances():
    snap = snapshot(down={"h1-vllm-0": "no answer in 0.8s"})
    by_name = {i.name: i for i in snap.instances}
    assert by_name["h1-vllm-0"].state == "down" and by_name["h1-vllm-0"].error == "no answer in 0.8s"
    assert [(h.name, h.state, h.up, h.total) for h in snap.hosts] == [("h0", "partial", 1, 2), ("h1", "down", 0, 2)]
    (router,) = snap.routers
    assert router.state == "up" and router.backends_up == 1 and router.backends["h1-vllm-1"] == "DOWN"
    assert by_name["h0-vllm-0"].router == "UP" and by_name["h0-vllm-1"].router == "DOWN"


def test_a_router_that_does_not_answer_leaves_its_backends_unknown():
    cur = a_round(1.0, "b")
    cur.scrapes[ROUTER.name] = Scrape(ROUTER, None, "connection refused")
    snap = build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, a_round(0.0, "a"), cur)
    assert snap.routers[0].state == "down" and {i.router for i in snap.instances} == {"?"}


def test_a_prefill_decode_front_door_is_shown_as_what_it_is():
    """belugactl's own P/D proxy keeps no backend list: its requests, not an empty 0/0 backends."""
    from prometheus_client import generate_latest

    from belugactl.workflows.serve.pd_proxy import PdProxy

    proxy = PdProxy(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    proxy.requests.labels(outcome="ok").inc(7)
    cur = a_round(1.0, "b")
    cur.scrapes[ROUTER.name] = Scrape(ROUTER, parse(generate_latest(proxy.registry).decode()))
    snap = build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, a_round(0.0, "a"), cur)
    (router,) = snap.routers
    assert (router.kind, router.state, router.requests) == ("pd-proxy", "up", 7)
    assert {i.router for i in snap.instances} == {None}  # no HAProxy: no router column to fill
    assert "up, P/D proxy, 7 requests" in plain(render_lines(snap, ViewState(), 80))


def test_a_prefill_decode_rack_is_scraped_where_its_proxy_listens(tmp_path):
    """The P/D proxy serves /metrics on the router's port (it has no stats port): top and the
    Prometheus export both read it there."""
    from belugactl.model.manifest import load_manifest
    from belugactl.workflows.top.source import TopSource

    path = tmp_path / "pd.yaml"
    roles = "instances_per_host: 2, kv_roles: [kv_producer, kv_consumer],"
    path.write_text(_rack(9470, 8000, 8404).replace("instances_per_host: 2,", roles))
    endpoints = TopSource.from_manifest(load_manifest(path), timeout_s=1).endpoints
    (router,) = [e for e in endpoints if e.job == "beluga-router"]
    assert router.address == "127.0.0.1:8090"  # serve.router.port's default; HAProxy's stats would be 8404


def test_quantile_interpolates_within_a_bucket_like_prometheus():
    buckets = [(0.001, 10.0), (0.01, 90.0), (0.1, 100.0), (float("inf"), 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.001 + 0.009 * (50 - 10) / 80)
    assert quantile(0.99, buckets) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 4.0)]) == 0.1  # only the +Inf bucket: its lower bound
    assert quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


# --- keys: sort and filter ----------------------------------------------------------------------------


def test_s_cycles_the_sort_column_and_r_reverses_it():
    state = ViewState()
    seen = [state.sort]
    for _ in range(7):
        state = press(state, "s")
        seen.append(state.sort)
    assert seen == ["host", "state", "hit", "loaded", "saved", "lookup", "running", "host"]
    assert press(state, "r").reverse and not press(press(state, "r"), "r").reverse


def test_sorting_puts_down_instances_first_and_unknown_figures_last():
    snap = snapshot()
    by_state = [i.name for i in visible(snap.instances, ViewState(sort="state"))]
    assert by_state == ["h0-vllm-1", "h1-vllm-0", "h1-vllm-1", "h0-vllm-0"]
    by_loaded = [i.name for i in visible(snap.instances, ViewState(sort="loaded"))]
    assert by_loaded[0] == "h0-vllm-0"  # the only one with a figure; the down ones follow in name order
    reversed_hosts = [i.name for i in visible(snap.instances, ViewState(sort="host", reverse=True))]
    assert reversed_hosts == ["h1-vllm-1", "h1-vllm-0", "h0-vllm-1", "h0-vllm-0"]


def test_slash_edits_a_host_filter_that_applies_as_typed():
    state = ViewState()
    for key in ["/", "h", "x", "\x7f", "1"]:
        state = press(state, key)
    assert state.editing and state.filter == "h1"
    assert [i.host for i in visible(snapshot().instances, state)] == ["h1", "h1"]
    state = press(state, "\r")
    assert not state.editing and state.filter == "h1"
    assert press(state, "q").quit  # outside the editor q quits...
    assert press(press(state, "/"), "q").filter == "h1q"  # ...inside it, it is a letter
    assert press(state, "\x1b").filter == ""  # Esc clears a kept filter


def test_keys_from_a_terminal_split_escape_sequences_whole():
    assert split_keys("s/h1\r") == ["s", "/", "h", "1", "\r"]
    assert split_keys("\x1b[A\x1bq") == ["\x1b[A", "\x1b", "q"]
    assert press(ViewState(), "\x1b[A") == ViewState()  # an arrow does nothing


# --- rendering ---------------------------------------------------------------------------------------


def _fits(text: str, width: int) -> None:
    for line in text.splitlines():
        assert len(line) <= width, line
        assert line == line.rstrip(), f"trailing spaces: {line!r}"


def test_a_snapshot_fits_80_columns_and_says_what_is_down():
    text = plain(render_lines(snapshot(), ViewState(), 80))
    _fits(text, 80)
    assert "metadata  h0 127.0.0.1:9470  up, epoch 1" in text
    assert "pool 1.2 MiB of 40.0 MiB (3.1%)" in text and "entries 100" in text
    assert "hit 83.3%" in text and "saved 480.0 KiB/s" in text
    assert "backends 1/4 up; not up: h0-vllm-1,h1-vllm-[0-1]" in text or "backends 1/4 up" in text
    assert "hosts 2: 0 up, 1 partial (h0), 1 down (h1)" in text
    rows = {line.split()[0] + " " + line.split()[1]: line for line in text.splitlines() if line.startswith("h")}
    assert "down: connection refused" in rows["h1 vllm-0"]
    assert rows["h0 vllm-0"].split()[2:] == ["up", "50.0%", "16.0M", "4.0M", "100us", "3/1", "UP"]


def test_a_narrow_screen_drops_table_columns_from_the_right_and_wraps_the_header():
    text = plain(render_lines(snapshot(), ViewState(), 45))
    _fits(text, 45)
    header = next(line for line in text.splitlines() if line.startswith("HOST"))
    assert header.split() == ["HOST", "INST", "STATE", "HIT%", "LOAD/s", "SAVE/s"]


def test_the_live_screen_is_cut_to_its_height_and_shows_the_keys():
    state = ViewState(filter="h", editing=True)
    text = plain(render_lines(snapshot(), state, 80, 14, live=True))
    assert len(text.splitlines()) == 14
    assert "... 3 more (filter with /)" in text
    assert text.splitlines()[-1].startswith("filter hosts: h_")
    short = plain(render_lines(snapshot(), state, 80, 5, live=True)).splitlines()
    assert len(short) == 5 and "lines hidden" in short[-3] and short[-1].startswith("filter hosts: h_")


def test_the_16_host_example_with_nothing_running_fits_80_columns(cli):
    result = cli("top", "-f", str(EXAMPLES / "beluga-rack.yaml"), "--once", "--interval", "0.2", "--timeout", "0.05")
    assert result.code == 0, result.stderr
    _fits(result.stdout, 80)
    assert "hosts 16: 0 up, 16 down (beluga-[00-15])" in result.stdout


def test_bytes_are_binary_units():
    assert [fmt_bytes(x) for x in (None, 0, 1536, 40 * 2**20)] == ["-", "0 B", "1.5 KiB", "40.0 MiB"]
    assert fmt_bytes(16 * 2**20, compact=True) == "16.0M"


# --- endpoints over HTTP ------------------------------------------------------------------------------


class _Recorded(ThreadingHTTPServer):
    """Answers GET /metrics with recorded texts: the first one first, then the last one for ever."""

    daemon_threads = True

    def __init__(self, bodies: list[str], status: int = 200) -> None:
        self.bodies, self.status, self.served = bodies, status, 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                srv: _Recorded = self.server  # type: ignore[assignment]
                body = srv.bodies[min(srv.served, len(srv.bodies) - 1)].encode()
                srv.served += 1
                self.send_response(srv.status if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                return

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@contextmanager
def serving(bodies: list[str], status: int = 200) -> Iterator[_Recorded]:
    srv = _Recorded(bodies, status)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fetch_says_why_an_endpoint_gave_nothing():
    refused = fetch(Target("beluga-vllm", f"127.0.0.1:{_closed_port()}", "h0", "h0-vllm-0"), 1.0)
    assert not refused.ok and refused.error == "connection refused"
    with serving(["<html>proxy error</html>"]) as html, serving(["gone"], status=404) as missing:
        assert fetch(Target("x", f"127.0.0.1:{html.port}", "h0", "x"), 2.0).error.startswith("not Prometheus text")
        assert fetch(Target("x", f"127.0.0.1:{missing.port}", "h0", "x"), 2.0).error == "HTTP 404 on /metrics"
    assert reason(urllib.error.URLError(socket.gaierror(-2, "Name or service not known")), 1.0) == "unknown host name"
    assert reason(urllib.error.URLError(TimeoutError()), 0.8) == "no answer in 0.8s"


def _rack(admin_port: int, port_base: int, stats_port: int) -> str:
    return top_rack("top-test", admin_port, port_base, f"router: {{stats_port: {stats_port}}}")


@pytest.fixture
def live_rack(tmp_path: Path) -> Iterator[Path]:
    """A manifest whose metadata server, h0-vllm-0 and router answer with the recorded texts over HTTP."""
    with (
        serving([recorded("metadata-server-a.prom"), recorded("metadata-server-b.prom")]) as mds,
        serving([recorded("vllm-a.prom"), recorded("vllm-b.prom")]) as vllm,
        serving([recorded("haproxy.prom")]) as router,
    ):
        path = tmp_path / "rack.yaml"
        path.write_text(_rack(mds.port, vllm.port, router.port))
        yield path


def test_once_json_is_one_document_with_the_rates(cli, live_rack):
    result = cli("top", "-f", str(live_rack), "--json", "--interval", "0.2")
    assert result.code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1 and doc["rack"] == "top-test"
    assert doc["metadata"]["state"] == "up" and doc["metadata"]["hit_rate"] == pytest.approx(100 / 120)
    assert doc["interval_s"] >= 0.2
    states = {i["name"]: i["state"] for i in doc["instances"]}
    assert states == {"h0-vllm-0": "up", "h0-vllm-1": "down", "h1-vllm-0": "down", "h1-vllm-1": "down"}
    assert doc["routers"][0]["backends_up"] == 1
    assert {e["job"] for e in doc["endpoints"]} == {"beluga-metadata", "beluga-vllm", "beluga-router"}


def test_once_prints_the_view_at_80_columns_when_piped(cli, live_rack):
    result = cli("top", "-f", str(live_rack), "--once", "--interval", "0.2", env={"COLUMNS": None})
    assert result.code == 0, result.stderr
    _fits(result.stdout, 80)
    assert "metadata  h0 127.0.0.1:" in result.stdout and "hit 83.3%" in result.stdout


def test_top_parses_the_manifest_once_and_resolves_no_layout(cli, live_rack, model_calls):
    result = cli("top", "-f", str(live_rack), "--once", "--interval", "0.2")
    assert result.code == 0, result.stderr
    assert model_calls["manifest parses"] == 1 and model_calls["layout resolutions"] == 0, dict(model_calls)


def test_bad_input_is_exit_2_with_the_fix(cli, tmp_path):
    no_serve = tmp_path / "bare.yaml"
    no_serve.write_text(_rack(9470, 8000, 8404).split("serve:")[0])
    result = cli("top", "-f", str(no_serve), "--once")
    assert result.code == 2 and "no serve section" in result.stderr
    result = cli("top", "-f", str(EXAMPLES / "cpu-demo.yaml"), "--interval", "0")
    assert result.code == 2 and "--interval" in result.stderr
    # CliRunner's stdin and stdout are not terminals: the live view says so and how to get a snapshot
    result = cli("top", "-f", str(EXAMPLES / "cpu-demo.yaml"))
    assert result.code == 2 and "needs a terminal" in result.stderr and "--once" in result.stderr


def test_the_live_loop_redraws_on_rounds_and_keys_and_quits_on_q():
    shown: list[tuple[bool, ViewState]] = []
    later = a_round(2.0, "b")
    rounds = itertools.chain([a_round(0.0, "a"), a_round(1.0, "b")], itertools.repeat(later))
    script = [[], [], "s", "/", "1", "\r", "q"]

    class Keys:
        def read(self, timeout_s: float) -> list[str]:
            if len(shown) < 3:  # wait for the first two rounds before typing
                threading.Event().wait(min(timeout_s, 0.02))
                return []
            step = script.pop(0) if script else "q"
            return list(step)

    def build(prev, cur):  # type: ignore[no-untyped-def]
        return build_snapshot("dp-test", ["h0", "h1"], ENDPOINTS, prev, cur)

    final = run_live(
        lambda: next(rounds), build, Keys(), lambda snap, st: shown.append((snap is not None, st)), interval_s=0.01
    )
    assert final.quit and final.sort == "state" and final.filter == "1"
    assert shown[0] == (False, ViewState())  # the screen before the first round
    assert any(st.sort == "state" for _, st in shown)
