"""In-process counters and latency summaries with standard names.

``grpc_server_handled_total{grpc_method,grpc_code}`` and ``grpc_server_handling_seconds`` as
the Prometheus gRPC conventions name them; ours as ``ragline_<thing>_<unit>``. GetStats exposes
them; a Prometheus exporter can read the same registry.
"""

from __future__ import annotations

import threading
from collections import defaultdict


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = defaultdict(float)
        self._seconds: dict[str, list[float]] = defaultdict(list)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._counters[_key(name, labels)] += amount

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        with self._lock:
            samples = self._seconds[_key(name, labels)]
            samples.append(seconds)
            if len(samples) > 10_000:  # keep a bounded recent window
                del samples[:5_000]

    def snapshot(self) -> dict[str, float]:
        """Counters, plus p50/p95 (seconds) and count of each summary."""
        with self._lock:
            out = dict(self._counters)
            for key, samples in self._seconds.items():
                ordered = sorted(samples)
                out[f"{key}_count"] = float(len(ordered))
                out[f"{key}_p50"] = ordered[len(ordered) // 2]
                out[f"{key}_p95"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        return out


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"
