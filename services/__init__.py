"""gRPC servicers, gateway orchestration, settings, interceptors, metrics, CLI."""

from __future__ import annotations
