"""Old path of recursa.obs.otel, kept for one release; import recursa.obs.otel instead."""

from recursa.obs.otel import *  # noqa: F401,F403
