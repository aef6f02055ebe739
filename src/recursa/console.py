"""Old path of recursa.obs.console, kept for one release; import recursa.obs.console instead."""

from recursa.obs.console import *  # noqa: F401,F403
