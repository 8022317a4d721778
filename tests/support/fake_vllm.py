"""An in-process stand-in for vLLM's OpenAI server on loopback, with a model of where KV comes from.

Real HTTP (`/v1/models`, `/v1/completions`, `/metrics`, `/health`), so `bench serve` runs against it
unchanged. Each completion takes a time set by where its prompt's KV comes from, as vLLM decides it:
- the local prefix cache (when on): blocks a request with the same `cache_salt` left here;
- the Beluga connector (`connector="beluga"`): blocks in the rack's shared pool under (salt, tokens),
  unless `kv_transfer_params.beluga.load` is false; computed prompts are saved there unless `save` is false;
- vLLM's ExampleConnector (`connector="example"`): files keyed by the tokens alone (no salt). With
  `chunk` set, a prompt longer than it was saved in two chunks: its load fails with the shape
  mismatch vLLM's worker raises, the request gets HTTP 500 and the engine is dead from then on;
- else a full prefill: `per_token_s` per prompt token.
Requests are served one at a time (an engine with one sequence slot), so the throughput of a burst
is the sum of its costs. vLLM's `vllm:prompt_tokens_by_source` counters and the Beluga connector's
stats files (`<stats_prefix>.<role>.json`) are kept as the real ones are.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Costs:
    per_token_s: float = 0.0005
    pool_s: float = 0.06
    local_s: float = 0.01
    example_s: float = 0.03
    lookup_us: int = 120  # what the fake connector reports per lookup / load metadata / copy
    load_metadata_us: int = 80
    load_us: int = 900
    save_metadata_us: int = 300
    save_delay_s: float = 0.0  # > 0: saves finish this long after the answer (asynchronous saves)


class EngineClock:
    """The time the fakes' engines spend, for the client that times them (`now` for its
    time.perf_counter): a request costs what its Costs say, plus TICK_S of handling, and nothing
    depends on how busy the machine is. The engines run one request at a time (each fake's lock),
    so a concurrent pass's wall time is the sum of its requests' costs, as with sleeping engines."""

    TICK_S = 1e-6

    def __init__(self) -> None:
        self._ns = 0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._ns / 1e9

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._ns += round((seconds + self.TICK_S) * 1e9)


@dataclass
class FakeRack:
    pool: set[tuple[str | None, tuple[int, ...]]] = field(default_factory=set)
    files: set[tuple[int, ...]] = field(default_factory=set)


class FakeVLLM:
    def __init__(
        self,
        rack: FakeRack,
        *,
        prefix_cache: bool = False,
        connector: str | None = "beluga",
        costs: Costs | None = None,
        stats_prefix: Path | None = None,
        log_file: Path | None = None,
        chunk: int | None = None,
        block_size: int = 32,
        clock: EngineClock | None = None,
    ) -> None:
        self.rack = rack
        self.clock = clock
        self.prefix_cache = prefix_cache
        self.connector = connector
        self.costs = costs or Costs()
        self.stats_prefix = stats_prefix
        self.log_file = log_file
        self.chunk = chunk
        self.block = block_size
        self.local: set[tuple[str | None, tuple[int, ...]]] = set()
        self.sources = {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}
        self.counters: dict[str, dict[str, int]] = {"scheduler": {}, "worker0": {}}
        self.dead = False
        self.requests: list[dict[str, Any]] = []
        self._engine = threading.Lock()
        self._stats_lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/health":
                    self._send(200 if not fake.dead else 503, b"")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "demo"}]}).encode())
                elif self.path == "/metrics":
                    lines = [
                        f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="demo",source="{k}"}} {v}'
                        for k, v in fake.sources.items()
                    ]
                    self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain")
                else:
                    self._send(404, b"")

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, doc = fake.complete(body)
                self._send(status, json.dumps(doc).encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the model ---------------------------------------------------------------------------
    def _count(self, role: str, **values: int) -> None:
        with self._stats_lock:
            for k, v in values.items():
                self.counters[role][k] = self.counters[role].get(k, 0) + v
            if self.stats_prefix is None:
                return
            path = Path(f"{self.stats_prefix}.{role}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps({"role": role, "counters": self.counters[role]}))
            tmp.replace(path)

    def _spend(self, seconds: float) -> None:
        # With a clock the cost is counted, not slept: the timings are exact however busy the machine.
        if self.clock is not None:
            self.clock.spend(seconds)
        else:
            time.sleep(seconds)

    def _save(self, key: tuple[str | None, tuple[int, ...]]) -> None:
        self.rack.pool.add(key)
        c = self.costs
        self._count("worker0", save_metadata_us=c.save_metadata_us, save_metadata_round_trips=2, save_requests=1)

    def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._engine:
            if self.dead:
                return 500, {"error": {"message": "EngineDeadError: EngineCore encountered an issue"}}
            prompt = [int(x) for x in body["prompt"]]
            salt = body.get("cache_salt")
            switches = ((body.get("kv_transfer_params") or {}).get("beluga")) or {}
            n = len(prompt)
            loadable = (n - 1) // self.block * self.block
            tokens = tuple(prompt[:loadable])
            key = (salt, tokens)
            c = self.costs
            where = "compute"
            if self.prefix_cache and key in self.local:
                where = "local"
            elif self.connector == "beluga" and switches.get("load", True) is not False:
                self._count("scheduler", lookups=1, lookup_us=c.lookup_us)
                if key in self.rack.pool:
                    where = "pool"
            elif self.connector == "example" and tokens in self.rack.files:
                where = "example"
            self.requests.append({"salt": salt, "where": where, "tokens": n, "switches": switches})
            if where == "local":
                self._spend(c.local_s)
                self.sources["local_cache_hit"] += loadable
                self.sources["local_compute"] += n - loadable
            elif where == "pool":
                self._spend(c.pool_s)
                self._count("scheduler", hit_requests=1)
                self._count("worker0", load_metadata_us=c.load_metadata_us, load_us=c.load_us, loaded_blocks=1)
                self.sources["external_kv_transfer"] += loadable
                self.sources["local_compute"] += n - loadable
            elif where == "example":
                if self.chunk is not None and n > self.chunk:
                    self.dead = True
                    if self.log_file is not None:
                        with open(self.log_file, "a") as fh:
                            fh.write(
                                "ERROR EngineCore failed\nTraceback (most recent call last):\n"
                                f"RuntimeError: shape mismatch: value tensor of shape [{self.chunk}, 2, 64] cannot "
                                f"be broadcast to indexing result of shape [{loadable}, 2, 64]\n"
                                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
                            )
                    return 500, {"error": {"message": "EngineCore encountered an issue"}}
                self._spend(c.example_s)
                self.sources["external_kv_transfer"] += loadable
                self.sources["local_compute"] += n - loadable
            else:
                self._spend(n * c.per_token_s)
                self.sources["local_compute"] += n
                if self.connector == "beluga" and switches.get("save", True) is not False:
                    if c.save_delay_s > 0:
                        threading.Timer(c.save_delay_s, self._save, (key,)).start()
                    else:
                        self._save(key)
                if self.connector == "example":
                    self.rack.files.add(tokens)
            if self.prefix_cache:
                self.local.add(key)
            token = sum(prompt) % 1000  # greedy: a function of the prompt alone
            return 200, {
                "choices": [{"token_ids": [token]}],
                "usage": {"prompt_tokens": n},
            }
