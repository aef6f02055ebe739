"""Observability: traces, their readers and views (console, JSON lines, OpenTelemetry, notebook,
the HTML viewer). Above recursa.base, below recursa.core (docs/architecture.md).
"""
