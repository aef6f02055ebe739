"""RL environments (llm / rlm / rlm_tips variants), rollouts, ablation reports and SFT export.

    from recursa.envs import get_env, run_rollout
    ro = await run_rollout("oolong", "rlm_tips", seed=0, model="local:qwen2.5-coder-0.5b")

The `verifiers` adapter is `recursa.envs.verifiers_env.load_environment` (extra: verifiers;
verifiers 0.4 gets `verifiers_v1`, 0.1.14-0.3 `verifiers_classic`).
"""

from __future__ import annotations

from .base import ENVS, VARIANTS, Env, get_env, strip_tips
from .rollout import (
    Rollout,
    make_rollout_specs,
    record_reward,
    reward_of,
    run_ablation,
    run_rollout,
    run_rollout_spec,
    run_rollouts,
)

__all__ = ["ENVS", "VARIANTS", "Env", "Rollout", "get_env", "make_rollout_specs",
           "record_reward", "reward_of", "run_ablation", "run_rollout", "run_rollout_spec",
           "run_rollouts", "strip_tips"]
