"""Old path of recursa.core.budget, kept for one release; import recursa.core.budget instead."""

from recursa.core.budget import *  # noqa: F401,F403
