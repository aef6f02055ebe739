"""Old path of recursa.base.images, kept for one release; import recursa.base.images instead."""

from recursa.base.images import *  # noqa: F401,F403
