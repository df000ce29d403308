"""One stage's collective stream in the overlap simulation: launches run one after another (*modelled*).

A launch's end is not fixed when it is launched: after its latency its bytes drain at
:meth:`~megatron_energy.sim.contention.CommLoad.rate_gbps`, which depends on whether compute runs beside it;
the simulator (:mod:`megatron_energy.sim.overlap`) settles progress over intervals in which that is constant.
"""

from __future__ import annotations

import math

from megatron_energy.sim.overlap_schedule import CommLaunch


class CollectiveStream:
    """One stage's collective stream: launches run one after another, each ending once its bytes are done.

    ``now_s`` is the time up to which progress is settled; the caller advances it (:meth:`advance`) over
    intervals in which whether compute runs beside is constant.
    """

    def __init__(self) -> None:
        self.now_s = 0.0
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.launches: list[CommLaunch] = []
        self.overlapped: list[float] = []
        self._latency_left_s = 0.0
        self._bytes_left = 0.0

    @property
    def head(self) -> int | None:
        """Index of the launch running at ``now_s`` (None when the stream is empty)."""
        return len(self.ends) if len(self.ends) < len(self.launches) else None

    @property
    def free_s(self) -> float:
        """End of its last launch (0 without launches); settled once :meth:`drain` ran."""
        return self.ends[-1] if self.ends else 0.0

    def push(self, launch: CommLaunch, at_s: float) -> None:
        """Launch at ``at_s`` (progress is settled alone up to it); it starts once the launches before end."""
        self.advance(at_s, beside=False)
        self.launches.append(launch)
        self.overlapped.append(0.0)
        if self.head == len(self.launches) - 1:
            self._start(self.now_s)

    def left_s(self, beside: bool) -> float:
        """Time the running launch needs to end, beside compute or not (inf when none)."""
        head = self.head
        if head is None:
            return math.inf
        rate = self.launches[head].load.rate_gbps(beside) * 1e9
        return self._latency_left_s + self._bytes_left / rate

    def advance(self, until_s: float, beside: bool) -> None:
        """Settle progress up to ``until_s``, beside compute or not.

        A launch that ends on the way lets the next one start then, in the same state.
        """
        while True:
            head = self.head
            if head is None:
                self.now_s = max(self.now_s, until_s)
                return
            left = self.left_s(beside)
            end_s = self.now_s + left
            if end_s <= until_s or math.isclose(end_s, until_s, rel_tol=1e-12):  # it ends; the next starts
                self.overlapped[head] += left if beside else 0.0
                self.now_s = end_s
                self.ends.append(end_s)
                if self.head is not None:
                    self._start(self.now_s)
                continue
            step = until_s - self.now_s
            if step <= 0:
                return
            self.overlapped[head] += step if beside else 0.0
            latency = min(step, self._latency_left_s)
            self._latency_left_s -= latency
            rate = self.launches[head].load.rate_gbps(beside) * 1e9
            self._bytes_left = max(0.0, self._bytes_left - (step - latency) * rate)
            self.now_s = until_s
            return

    def finish(self, index: int) -> float:
        """End of launch ``index``, settling progress alone (no compute beside) until it is done."""
        while len(self.ends) <= index:
            self.advance(self.now_s + self.left_s(beside=False), beside=False)
        return self.ends[index]

    def drain(self) -> float:
        """Settle every launch alone; the end of the last (or ``now_s`` when there are none)."""
        return self.finish(len(self.launches) - 1) if self.launches else self.now_s

    def _start(self, at_s: float) -> None:
        launch = self.launches[len(self.starts)]
        self.starts.append(at_s)
        self._latency_left_s = launch.load.latency_s
        self._bytes_left = launch.traffic_bytes
