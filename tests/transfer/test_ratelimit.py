import threading
import time

import pytest

from dualpath.transfer import RateLimiter, TrafficClass
from dualpath.transfer.ratelimit import default_chunk_bytes

HIGH, LOW = TrafficClass.HIGH, TrafficClass.LOW
MB = 1_000_000


def timed(fn) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


@pytest.mark.parametrize("cls", [HIGH, LOW])
def test_moving_n_bytes_at_rate_r_takes_n_over_r_for_either_class_alone(cls):
    rate, nbytes = 4 * MB, 1 * MB
    limiter = RateLimiter(rate)
    elapsed = timed(lambda: limiter.transmit(nbytes, cls))
    ideal = nbytes / rate
    assert (nbytes - limiter.chunk_bytes) / rate <= elapsed <= 1.2 * ideal + 0.02
    stats = limiter.stats()
    assert stats.bytes_by_class[cls.name] == nbytes and stats.total_bytes == nbytes
    assert stats.busy_s == pytest.approx(elapsed, rel=0.1, abs=0.01)
    assert 0.5 < stats.utilisation <= 1.0


def test_concurrent_transfers_never_exceed_the_rate():
    rate = 8 * MB
    limiter = RateLimiter(rate, chunk_bytes=32 * 1024)
    threads = [threading.Thread(target=limiter.transmit, args=(400_000, c)) for c in (HIGH, LOW, LOW, HIGH)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    assert elapsed >= (1_600_000 - limiter.chunk_bytes) / rate


def _race(limiter: RateLimiter, high_bytes: int, low_bytes: int) -> int:
    """Start a HIGH and a LOW transfer together; return the LOW bytes moved when HIGH finished."""
    barrier = threading.Barrier(2)
    low_at_high_end: list[int] = []

    def high() -> None:
        barrier.wait()
        limiter.transmit(high_bytes, HIGH)
        low_at_high_end.append(limiter.stats().bytes_by_class["LOW"])

    def low() -> None:
        barrier.wait()
        limiter.transmit(low_bytes, LOW)

    threads = [threading.Thread(target=high), threading.Thread(target=low)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return low_at_high_end[0]


def test_two_busy_classes_share_by_weight():
    chunk = 16 * 1024
    limiter = RateLimiter(8 * MB, weights={HIGH: 3.0, LOW: 1.0}, chunk_bytes=chunk)
    low_bytes = _race(limiter, high_bytes=1_500_000, low_bytes=1_500_000)
    assert abs(low_bytes - 500_000) <= 4 * chunk  # 1 : 3 while both wait


def test_default_weights_give_high_about_99_percent():
    chunk = 16 * 1024
    limiter = RateLimiter(8 * MB, chunk_bytes=chunk)
    low_bytes = _race(limiter, high_bytes=1_000_000, low_bytes=1_000_000)
    assert low_bytes <= 1_000_000 / 99 + 2 * chunk


def test_high_transfer_overtakes_a_low_bulk_transfer_within_a_chunk():
    rate, chunk = 8 * MB, 32 * 1024
    limiter = RateLimiter(rate, chunk_bytes=chunk)
    bulk = threading.Thread(target=limiter.transmit, args=(2 * MB, LOW))
    bulk.start()
    time.sleep(0.03)
    elapsed = timed(lambda: limiter.transmit(64 * 1024, HIGH))
    assert elapsed <= (chunk + 64 * 1024) / rate + 0.02
    assert bulk.is_alive()  # the bulk transfer (≈0.25 s) was still going
    bulk.join()


def test_abandoned_transfer_frees_the_link():
    limiter = RateLimiter(4 * MB, chunk_bytes=64 * 1024)
    gen = limiter.chunks(4 * MB, LOW)
    next(gen)
    gen.close()
    assert limiter.queued_bytes == 0
    assert timed(lambda: limiter.transmit(200_000, HIGH)) < 0.2


def test_a_sender_that_wakes_late_between_transfers_keeps_the_link_busy_with_ready_s():
    """Five back-to-back 20 ms transfers from one thread that sleeps 15 ms after each (a late wake-up):
    with the bytes' `ready_s` the link runs them end to end (≈ 100 ms), without it each sleep is idle link
    time (≥ 160 ms). Either way the link never beats its rate."""
    rate = 4 * MB
    nbytes = int(rate * 0.02)

    def sender(ready: bool) -> float:
        limiter = RateLimiter(rate)
        start = time.monotonic()
        for _ in range(5):
            limiter.transmit(nbytes, LOW, ready_s=start if ready else None)
            time.sleep(0.015)
        return time.monotonic() - start - 0.015  # the last sleep is after the link's work

    with_ready, without = sender(True), sender(False)
    assert (5 * nbytes - default_chunk_bytes(rate)) / rate <= with_ready < 0.14
    assert without >= 0.16


def test_ready_s_never_starts_a_transfer_before_the_link_is_free():
    """A transfer that says its bytes were ready long ago still queues behind the one on the link."""
    rate = 4 * MB
    limiter = RateLimiter(rate)
    first = threading.Thread(target=limiter.transmit, args=(int(rate * 0.1), LOW))
    start = time.monotonic()
    first.start()
    time.sleep(0.01)
    limiter.transmit(int(rate * 0.02), LOW, ready_s=start - 10.0)
    assert time.monotonic() - start >= 0.12 - limiter.chunk_bytes / rate
    first.join()


def test_an_idle_link_starts_a_transfer_when_its_bytes_were_ready():
    limiter = RateLimiter(4 * MB)
    assert timed(lambda: limiter.transmit(200_000, LOW, ready_s=time.monotonic() - 1.0)) < 0.03


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError):
        RateLimiter(0)
    with pytest.raises(ValueError):
        RateLimiter(1e6, weights={HIGH: 1.0})
