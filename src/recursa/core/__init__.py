"""The RLM itself: the run loop, dispatch of sub-calls, budgets, guards, prompts, contexts and
the public RLM / Session API. Above base, obs, models, sandbox and documents; below the front
ends (docs/architecture.md).
"""
