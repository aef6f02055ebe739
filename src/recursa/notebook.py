"""Old path of recursa.obs.notebook, kept for one release; import recursa.obs.notebook instead."""

from recursa.obs.notebook import *  # noqa: F401,F403
