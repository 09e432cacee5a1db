import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dualpath.runtime.prefill import run_pipeline


def _run(layerwise: bool, layers: int = 4):
    log: list[tuple[str, int]] = []
    lock = threading.Lock()

    def note(kind):
        def fn(layer):
            with lock:
                log.append((kind, layer))

        return fn

    with ThreadPoolExecutor(1) as io, ThreadPoolExecutor(1) as tx:
        run_pipeline(
            layers, layerwise, load=note("load"), compute=note("compute"), send=note("send"), io=io, tx=tx
        )
    return log


def test_layerwise_computes_each_layer_after_its_load_and_sends_after_its_compute():
    log = _run(layerwise=True)
    for layer in range(4):
        assert log.index(("load", layer)) < log.index(("compute", layer)) < log.index(("send", layer))
    assert [layer for kind, layer in log if kind == "compute"] == [0, 1, 2, 3]


def test_the_load_of_layer_i_plus_1_overlaps_the_compute_of_layer_i():
    spans: dict[tuple[str, int], tuple[float, float]] = {}

    def timed(kind, seconds):
        def fn(layer):
            start = time.monotonic()
            time.sleep(seconds)
            spans[(kind, layer)] = (start, time.monotonic())

        return fn

    with ThreadPoolExecutor(1) as io, ThreadPoolExecutor(1) as tx:
        started = time.monotonic()
        run_pipeline(
            4,
            True,
            load=timed("load", 0.05),
            compute=timed("compute", 0.05),
            send=timed("send", 0.0),
            io=io,
            tx=tx,
        )
        elapsed = time.monotonic() - started
    for layer in range(3):
        assert spans[("load", layer + 1)][0] < spans[("compute", layer)][1]
    # (layers + 1) x layer time, not 2 x layers x layer time (STYLE habit 11)
    assert elapsed < 0.05 * (2 * 4) * 0.85


def test_basic_loads_every_layer_before_the_first_compute():
    log = _run(layerwise=False)
    assert [k for k, _ in log] == ["load"] * 4 + ["compute"] * 4 + ["send"] * 4


def test_a_failing_load_surfaces_on_the_caller():
    def boom(layer):
        raise OSError("disk gone")

    with ThreadPoolExecutor(1) as io, ThreadPoolExecutor(1) as tx, pytest.raises(OSError, match="disk gone"):
        run_pipeline(3, True, load=boom, compute=lambda _: None, send=lambda _: None, io=io, tx=tx)
