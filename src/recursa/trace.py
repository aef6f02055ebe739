"""Old path of recursa.obs.trace, kept for one release; import recursa.obs.trace instead."""

from recursa.obs.trace import *  # noqa: F401,F403
