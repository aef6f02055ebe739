"""The bottom layer: value types, errors and process-wide plumbing every other layer shares.

It imports nothing else of recursa (docs/architecture.md).
"""
