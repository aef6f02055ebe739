"""The verifiers adapter for whichever verifiers is installed (`pip install 'recursa[verifiers]'`).

    from recursa.envs.verifiers_env import load_environment
    env = load_environment("oolong", "rlm_tips", num_examples=50)

verifiers 0.4 replaced the classic environment API (`MultiTurnEnv`, `Rubric`, `generate`) by
tasksets, harnesses and an interception server (`verifiers.v1`); `recursa.envs.verifiers_v1`
targets that. 0.1.14 - 0.3 get the classic adapter, `recursa.envs.verifiers_classic`. Both
build the same environments (research, math_python, oolong, verbatim_copy) in the same
variants (llm, rlm, rlm_tips) and score them with the same scorers.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from recursa.base.extras import MissingExtra


def verifiers_version() -> tuple[int, int]:
    """(major, minor) of the installed verifiers; ImportError when it is not installed."""
    try:
        v = version("verifiers")
    except PackageNotFoundError as e:
        raise MissingExtra("verifiers", "the verifiers adapter", module="verifiers") from e
    major, minor = (v.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


HARNESS_API = verifiers_version() >= (0, 4)

if HARNESS_API:
    from recursa.envs.verifiers_v1 import (
        PLUGIN_ID,
        RecursaEnv,
        RecursaHarness,
        RecursaHarnessConfig,
        RecursaTask,
        RecursaTaskData,
        RecursaTaskset,
        RecursaTasksetConfig,
        load_environment,
    )
    __all__ = ["HARNESS_API", "PLUGIN_ID", "RecursaEnv", "RecursaHarness",
               "RecursaHarnessConfig", "RecursaTask", "RecursaTaskData", "RecursaTaskset",
               "RecursaTasksetConfig", "load_environment", "verifiers_version"]
else:
    from recursa.envs.verifiers_classic import (
        PolicyClient,
        RecursaClient,
        RecursaEnv,
        load_environment,
    )
    __all__ = ["HARNESS_API", "PolicyClient", "RecursaClient", "RecursaEnv", "load_environment",
               "verifiers_version"]
