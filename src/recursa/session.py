"""Old path of recursa.core.session, kept for one release; import recursa.core.session instead."""

from recursa.core.session import *  # noqa: F401,F403
