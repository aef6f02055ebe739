"""Old path of recursa.core.context, kept for one release; import recursa.core.context instead."""

from recursa.core.context import *  # noqa: F401,F403
