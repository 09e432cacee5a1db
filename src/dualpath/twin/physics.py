"""What the CPU runtime pays that a GPU cluster does not: the simulator's physics, extended for the twin.

`TwinSimulation` is the simulator (`sim.driver.Simulation`, same core, same links) with the runtime's own
costs added, each from a calibration measurement (docs/twin.md "What the twin adds"):

- Shared cores: every engine is one Python process computing on one torch thread, and the host has
  `cpu_count` cores. The engines share them with each other and with the host's other runnable threads
  (`background_threads`: the scheduler, the load generator, other jobs; counted by
  `host_load.HostLoadSampler` while the runtime ran). Processor sharing: a forward or a decode run that
  starts while k engines compute takes max(1, (k + background) / cores) times its calibrated CPU time
  (calibration times one thread's CPU, i.e. an idle core). The factor is taken when the work starts.
- Control round trips: a PE forward and every decode step is one message from the scheduler and one
  completion back (`control_round_trip_s`); a forward also pays its embedding + LM head
  (`prefill_head_s`, which the cost model's layer terms do not include).
- Store writes: the runtime's `StorageWriter` paces a block on the SNIC and then puts it in the
  `FileStore` (temp file, fsync, rename: `store_write_op_s`), one block after the other on one thread.
  The fixed part holds the writer as bytes would, so it travels as bytes on the persist path
  (`store_write_op_s` x SNIC rate per block); SNIC byte counters exclude it.
- Oracle store writes: with I/O skipped, the DE's writer thread stores every block that became whole
  (runtime/de_executor.py `_persist_inline`); a request's last decode step waits for its writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dualpath.engine import commands as cmd
from dualpath.runtime.loadgen import poisson_starts
from dualpath.sim.agents import Round
from dualpath.sim.cost import CostModel
from dualpath.sim.driver import SimConfig, Simulation
from dualpath.twin.calibrate import CalibrationOverheads


class _RuntimeCost:
    """The calibrated cost model as the runtime's processes experience it (shared cores, fixed costs)."""

    def __init__(self, base: CostModel, twin: TwinSimulation) -> None:
        self._base, self._twin = base, twin

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def prefill_forward_time_s(self, per_gpu_batches: Sequence[Sequence[Any]]) -> float:
        o = self._twin.overheads
        fixed_s = o.prefill_head_s + o.control_round_trip_s
        return (self._base.prefill_forward_time_s(per_gpu_batches) + fixed_s) * self._twin.cpu_share(
            starting=1
        )

    def prefill_layer_time_s(self, per_gpu_batches: Sequence[Sequence[Any]], layer: int) -> float:
        return self._base.prefill_layer_time_s(per_gpu_batches, layer) * self._twin.cpu_share(starting=1)

    def prefill_step_s(
        self, per_gpu_batches: Sequence[Sequence[Any]], layer_index: int
    ) -> tuple[float, float, list[float]]:
        """The simulator's one-pass step cost (`CostModel.prefill_step_s`) with the same runtime terms."""
        forward_s, layer_s, attention = self._base.prefill_step_s(per_gpu_batches, layer_index)
        o = self._twin.overheads
        share = self._twin.cpu_share(starting=1)
        fixed_s = o.prefill_head_s + o.control_round_trip_s
        return (forward_s + fixed_s) * share, layer_s * share, attention

    def decode_step_max_s(self, shape: Sequence[tuple[int, int]]) -> float:
        step_s = self._base.decode_step_max_s(shape)
        return (step_s + self._twin.overheads.control_round_trip_s) * self._twin.cpu_share(starting=0)

    def decode_step_time_s(self, batch_size: int, total_context_tokens: int) -> float:
        step_s = self._base.decode_step_time_s(batch_size, total_context_tokens)
        # The run's own DE is already marked busy when its step time is asked for.
        return (step_s + self._twin.overheads.control_round_trip_s) * self._twin.cpu_share(starting=0)


class TwinSimulation(Simulation):
    def __init__(
        self,
        config: SimConfig,
        trajectories: Sequence[Sequence[Round]],
        *,
        seed: int,
        overheads: CalibrationOverheads,
        host_cores: float,
        background_threads: float = 0.0,
    ) -> None:
        self._seed = seed  # read by _arrivals during the base constructor
        super().__init__(config, trajectories, seed=seed)
        self.overheads, self.host_cores = overheads, host_cores
        self.background_threads = background_threads
        self.cost = _RuntimeCost(self.cost, self)  # type: ignore[assignment]
        self.persist_overhead_bytes: dict[int, float] = {}  # per DE node: fsync time carried as bytes
        self._stall_s: dict[int, float] = {}
        self._stalled: set[int] = set()
        self._written: set[int] = set()  # oracle joiners whose prompt blocks are queued
        self._writer_free_s: dict[int, float] = {}  # oracle: per DE node, when its writer is idle

    def _arrivals(self, rng: np.random.Generator) -> None:
        """Agent starts exactly as the runtime's load generator draws them (`runtime.loadgen.poisson_starts`)."""
        starts = poisson_starts(len(self.agents), self.config.aps, np.random.default_rng([self._seed, 1]))
        for agent, start_s in zip(self.agents, starts, strict=True):
            agent.start_s = start_s
            self.sim.schedule_at(start_s, self._next_round, agent)

    # ---- shared cores --------------------------------------------------------------------------
    def cpu_share(self, *, starting: int) -> float:
        prefill = sum(1 for s in self._steps.values() if not s.compute_done)
        decode = sum(1 for r in self._decode.values() if r.busy)
        busy = prefill + decode + starting + self.background_threads
        return max(1.0, busy / self.host_cores)

    def _start_step(self, c: cmd.StartPrefillStep) -> None:
        super()._start_step(c)
        self._retime_decode()

    def _compute_done(self, step: Any) -> None:
        super()._compute_done(step)
        self._retime_decode()

    def _retime_decode(self) -> None:
        """A forward started or ended: the running decode runs end at their next step boundary and
        restart with the new core share (the same cut a joiner makes)."""
        for node, run in self._decode.items():
            if run.busy:
                self._decode_changed(cmd.DecodeChanged(node_id=node))

    # ---- store writes ----------------------------------------------------------------------------
    def _persist(self, c: cmd.StartPersist) -> None:
        blocks = c.tokens // self.cluster.scheduler.block_tokens
        extra = blocks * self.overheads.store_write_op_s * self.cluster.hardware.snic_bytes_per_s
        node = self.core.node_of_engine(c.de_engine)
        self.persist_overhead_bytes[node] = self.persist_overhead_bytes.get(node, 0.0) + extra
        item = (c.request.request_id, c.from_hbm, c.de_engine)
        pipe = self._d2h_pipe(c.de_engine) if c.from_hbm else self._persist_pipe(c.de_engine)
        pipe.put(c.tokens * self.kv_bytes + extra, item)
        if not c.from_hbm:
            self._touched[pipe] = None

    # ---- oracle: the DE writes whole blocks beside its decode loop ----------------------------------
    # runtime/de_executor.py `_persist_inline`: with I/O skipped there are no persist commands; every
    # block that becomes whole (a joiner's prompt blocks beyond its hit at its first step, then one per
    # block_tokens generated) goes to the DE's one StorageWriter thread (FIFO, store_write_op_s each),
    # and a request's last decode step waits until its writes have landed.
    def _enqueue_writes(self, node: int, blocks: int) -> float:
        start_s = max(self._writer_free_s.get(node, 0.0), self.sim.now_s)
        self._writer_free_s[node] = start_s + blocks * self.overheads.store_write_op_s
        return self._writer_free_s[node]

    def _oracle_joins(self, node: int) -> None:
        bt = self.cluster.scheduler.block_tokens
        for r in self.core.de_nodes[node].joining:
            if r.request_id not in self._written:
                self._written.add(r.request_id)
                self._enqueue_writes(node, max(0, (r.prompt_tokens + 1) // bt - r.hit_tokens // bt))

    def _done(self, c: cmd.RequestDone) -> None:
        r = c.request
        if self.mode.skip_io and r.de_engine is not None:
            bt = self.cluster.scheduler.block_tokens
            decode_blocks = max(0, (r.prompt_tokens + r.gen_tokens - 1) // bt - (r.prompt_tokens + 1) // bt)
            node = self.core.node_of_engine(r.de_engine)
            landed_s = self._enqueue_writes(node, decode_blocks)
            # Its last step waits for them; charged before the DE's next run (same DE time; the
            # request's own done is not delayed here).
            self._stall_s[node] = max(self._stall_s.get(node, 0.0), landed_s - self.sim.now_s)
            self._written.discard(r.request_id)
        super()._done(c)

    def _decode_start(self, node: int) -> None:
        if node in self._stalled:
            return
        stall = self._stall_s.pop(node, 0.0)
        if self.mode.skip_io:
            self._oracle_joins(node)
        if stall > 0.0:
            self._stalled.add(node)
            self.sim.schedule(stall, self._decode_resume, node)
            return
        super()._decode_start(node)

    def _decode_resume(self, node: int) -> None:
        self._stalled.discard(node)
        self._decode_start(node)  # joiners that came during the stall write their blocks too
