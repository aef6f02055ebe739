"""Old path of recursa.core.batch.run, kept for one release; import recursa.core.batch.run."""

from recursa.core.batch.run import *  # noqa: F401,F403
