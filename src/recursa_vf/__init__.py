"""The `recursa-vf` verifiers 0.4 plugin: verifiers resolves a taskset or harness id to an
importable top-level package exporting its classes, so this one re-exports
recursa.envs.verifiers_v1 (`vf-eval recursa-vf --env.taskset.env oolong ...`)."""

from recursa.envs.verifiers_v1 import RecursaEnv, RecursaHarness, RecursaTaskset

__all__ = ["RecursaEnv", "RecursaHarness", "RecursaTaskset"]
