"""`GET /metrics`: the scheduler's Prometheus view of the cluster (prometheus-client text format).

One registry per scheduler (no process-global collectors), fed by node reports over the control plane and
by request completions. Series:

    dualpath_snic_bytes_total{node, direction}      bytes through each node's emulated SNIC (rx = reads)
    dualpath_snic_busy_seconds_total{node, direction}
    dualpath_read_queue_tokens{node}                the node's storage read queue (paper §6: read_q)
    dualpath_requests_total{read_side}              per-path request counts (pe / de / none)
    dualpath_ttft_seconds, dualpath_tpot_seconds    histograms (server-side, from arrival at the API)
    dualpath_corrupt_blocks_recomputed_total        blocks that failed their checksum and were recomputed
    dualpath_lost_blocks_recomputed_total           blocks of planned hits that a read found corrupt or
                                                    missing (or that came after one): recomputed, rewritten
    dualpath_store_write_errors_total{node}         KV block writes that failed (ENOSPC, EIO, ...)
    dualpath_node_up{node}, dualpath_node_down_total{node}   node failures (exit or silence) and re-joins
    dualpath_requests_replanned_total               requests that continued elsewhere after a node failure
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Bucket edges span the tiny model on CPU (ms) up to the paper's 4 s TTFT SLO (§7.2) and beyond.
_TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
_TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.snic_bytes = Gauge(
            "dualpath_snic_bytes_total",
            "Bytes through a node's emulated SNIC",
            ["node", "direction"],
            registry=self.registry,
        )
        self.snic_busy = Gauge(
            "dualpath_snic_busy_seconds_total",
            "Seconds a node's emulated SNIC had a transfer in flight",
            ["node", "direction"],
            registry=self.registry,
        )
        self.read_wait = Gauge(
            "dualpath_snic_read_wait_seconds_total",
            "Seconds a node had storage reads waiting or in flight",
            ["node"],
            registry=self.registry,
        )
        self.snic_rate = Gauge(
            "dualpath_snic_rate_bytes_per_s",
            "A node's emulated SNIC bandwidth",
            ["node"],
            registry=self.registry,
        )
        self.read_queue = Gauge(
            "dualpath_read_queue_tokens",
            "Tokens waiting in a node's storage read queue",
            ["node"],
            registry=self.registry,
        )
        self.decode_restarts = Gauge(
            "dualpath_decode_restarts_total",
            "Decode runs that continued the batch of the run before (a DE's counter)",
            ["node"],
            registry=self.registry,
        )
        self.decode_restart = Gauge(
            "dualpath_decode_restart_seconds_total",
            "Time from the end of a decode run to the start of the next that continued its batch",
            ["node"],
            registry=self.registry,
        )
        self.engine_pieces = Gauge(
            "dualpath_engine_pieces_total",
            "Work pieces of a node's engine thread (PE: forwards; DE: decode runs)",
            ["node"],
            registry=self.registry,
        )
        self.engine_seconds = Gauge(
            "dualpath_engine_seconds_total",
            "Wall time of those pieces, and the CPU time the engine thread spent in them",
            ["node", "clock"],
            registry=self.registry,
        )
        self.requests = Counter(
            "dualpath_requests",
            "Requests served, by the side that read their KV",
            ["read_side"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "dualpath_ttft_seconds", "Time to first token", buckets=_TTFT_BUCKETS_S, registry=self.registry
        )
        self.tpot = Histogram(
            "dualpath_tpot_seconds",
            "Time per output token after the first",
            buckets=_TPOT_BUCKETS_S,
            registry=self.registry,
        )
        self.corrupt = Gauge(
            "dualpath_corrupt_blocks_recomputed_total",
            "KV blocks that failed their checksum and were recomputed",
            registry=self.registry,
        )

        self.lost = Counter(
            "dualpath_lost_blocks_recomputed",
            "Blocks of planned cache hits found corrupt or missing (or after one) by a read: recomputed",
            registry=self.registry,
        )
        self.write_errors = Gauge(
            "dualpath_store_write_errors_total",
            "KV block writes to the store that failed (no space, I/O error); the blocks are not stored",
            ["node"],
            registry=self.registry,
        )

        self.node_up = Gauge("dualpath_node_up", "1 while the node serves, 0 once marked down", ["node"],
                             registry=self.registry)  # fmt: skip
        self.node_down = Counter("dualpath_node_down", "Times the node was marked down (exit or silence)",
                                 ["node"], registry=self.registry)  # fmt: skip
        self.replanned = Counter("dualpath_requests_replanned",
                                 "Requests that continued on other nodes after a node failure",
                                 registry=self.registry)  # fmt: skip

    def observe_node_state(self, node_id: str, *, up: bool) -> None:
        self.node_up.labels(node_id).set(1.0 if up else 0.0)
        if not up:
            self.node_down.labels(node_id).inc()

    def observe_replanned(self) -> None:
        self.replanned.inc()

    def observe_node(self, node_id: str, stats: dict[str, float]) -> None:
        """A node report's cumulative counters (the node owns them; we mirror its latest values)."""
        for direction in ("rx", "tx"):
            self.snic_bytes.labels(node_id, direction).set(stats.get(f"snic_{direction}_bytes", 0.0))
            self.snic_busy.labels(node_id, direction).set(stats.get(f"snic_{direction}_busy_s", 0.0))
        self.read_queue.labels(node_id).set(stats.get("read_q_tokens", 0.0))
        self.read_wait.labels(node_id).set(stats.get("snic_read_wait_s", 0.0))
        self.snic_rate.labels(node_id).set(stats.get("snic_bytes_per_s", 0.0))
        if "store_write_errors" in stats:
            self.write_errors.labels(node_id).set(stats["store_write_errors"])
        if "decode_restarts" in stats:
            self.decode_restarts.labels(node_id).set(stats["decode_restarts"])
            self.decode_restart.labels(node_id).set(stats.get("decode_restart_s", 0.0))
        if "engine_pieces" in stats:
            self.engine_pieces.labels(node_id).set(stats["engine_pieces"])
            self.engine_seconds.labels(node_id, "wall").set(stats.get("engine_wall_s", 0.0))
            self.engine_seconds.labels(node_id, "cpu").set(stats.get("engine_cpu_s", 0.0))

    def observe_lost_blocks(self, blocks: int) -> None:
        self.lost.inc(blocks)

    def set_corrupt_total(self, total: int) -> None:
        self.corrupt.set(total)

    def observe_request(self, *, read_side: str, ttft_s: float, tpot_s: float | None) -> None:
        self.requests.labels(read_side).inc()
        self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def parse_decode_restarts(text: str) -> tuple[float, float]:
    """(restarts, seconds) summed over the DEs of a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"dualpath_decode_restarts_total": 0.0, "dualpath_decode_restart_seconds_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["dualpath_decode_restarts_total"], totals["dualpath_decode_restart_seconds_total"]


def parse_snic(text: str) -> dict[str, dict[str, float]]:
    """Per node from a /metrics page: `rx`, `tx` (bytes), `read_wait_s`, `rate_bytes_per_s`."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {
        "dualpath_snic_read_wait_seconds_total": "read_wait_s",
        "dualpath_snic_rate_bytes_per_s": "rate_bytes_per_s",
    }
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "dualpath_snic_bytes_total":
                out.setdefault(sample.labels["node"], {})[sample.labels["direction"]] = sample.value
            elif sample.name in names:
                out.setdefault(sample.labels["node"], {})[names[sample.name]] = sample.value
    return dict(sorted(out.items()))


def parse_engine_work(text: str) -> dict[str, tuple[float, float, float]]:
    """Per node of a /metrics page: its engine thread's (pieces, wall s, CPU s) (`os_thread.EngineWork`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "dualpath_engine_pieces_total":
                out.setdefault(sample.labels["node"], [0.0, 0.0, 0.0])[0] = sample.value
            elif sample.name == "dualpath_engine_seconds_total":
                slot = 1 if sample.labels["clock"] == "wall" else 2
                out.setdefault(sample.labels["node"], [0.0, 0.0, 0.0])[slot] = sample.value
    return {node: (v[0], v[1], v[2]) for node, v in out.items()}
