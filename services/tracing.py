"""OpenTelemetry tracing across hops: one trace per request, from the gateway to each stage.

Off by default (``RAGLINE_TRACING_EXPORTER=none``). On, every server port gets
OpenTelemetry's grpc.aio server interceptor and every stage client its client interceptors
(``opentelemetry-instrumentation-grpc``), which carry the trace context in the call's metadata
(W3C ``traceparent``), so a stage's spans join the gateway's trace; the gateway adds a span per
stage (retrieve, graph, credibility, generate) through the OpenTelemetry API, which is a no-op
while tracing is off. Exporters: OTLP over gRPC to a collector, or JSON lines to a file (one per
process; for tests and a quick look). Needs the ``[otel]`` extra.
"""

from __future__ import annotations

import logging
from typing import Any

from services.settings import TracingSettings

logger = logging.getLogger(__name__)

_provider: Any = None
"""The process's tracer provider once tracing is set up (None: off)."""


def setup_tracing(settings: TracingSettings, role: str) -> bool:
    """Install the tracer provider the settings ask for (once per process); whether tracing
    is on.

    Raises:
        ImportError: tracing asked for without the ``[otel]`` extra installed.
    """
    global _provider
    if settings.exporter == "none":
        return False
    if _provider is not None:
        return True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
    except ImportError as exc:
        raise ImportError(
            f"RAGLINE_TRACING_EXPORTER={settings.exporter} needs OpenTelemetry: "
            "pip install 'ragline[otel]'"
        ) from exc
    name = settings.service_name or f"ragline-{role}"
    provider = TracerProvider(
        resource=Resource.create({"service.name": name}),
        sampler=ParentBasedTraceIdRatio(settings.sample_ratio),
    )
    if settings.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        try:
            otlp = OTLPSpanExporter(
                endpoint=settings.otlp_endpoint, insecure=settings.otlp_insecure
            )
        except ValueError as exc:
            raise ValueError(
                f"RAGLINE_TRACING_OTLP_ENDPOINT={settings.otlp_endpoint}: {exc}"
            ) from None
        provider.add_span_processor(BatchSpanProcessor(otlp))
    else:  # file: every span as a JSON line as it ends (small volumes: tests, a quick look)
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        if settings.file is None:
            raise ValueError("RAGLINE_TRACING_EXPORTER=file needs RAGLINE_TRACING_FILE")
        try:
            settings.file.parent.mkdir(parents=True, exist_ok=True)
            out = settings.file.open("a", encoding="utf-8")
        except OSError as exc:
            raise ValueError(
                f"RAGLINE_TRACING_FILE={settings.file}: {exc.strerror or exc}"
                + (f" ({exc.filename})" if exc.filename else "")
            ) from None
        exporter = ConsoleSpanExporter(
            out=out, formatter=lambda span: span.to_json(indent=None) + "\n"
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    logger.info("tracing to %s as %s", settings.exporter, name)
    return True


def server_interceptors() -> list[Any]:
    """OpenTelemetry's grpc.aio server interceptor when tracing is on (else none)."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_provider)]


def client_interceptors() -> list[Any]:
    """OpenTelemetry's grpc.aio client interceptors when tracing is on (else none)."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=_provider))


def shutdown() -> None:
    """Flush what is buffered (the OTLP exporter batches)."""
    if _provider is not None:
        _provider.shutdown()
