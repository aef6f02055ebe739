"""Old path of recursa.core.rlm, kept for one release; import recursa.core.rlm instead."""

from recursa.core.rlm import *  # noqa: F401,F403
