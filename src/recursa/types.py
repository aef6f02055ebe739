"""Old path of recursa.base.types, kept for one release; import recursa.base.types instead."""

from recursa.base.types import *  # noqa: F401,F403
