"""Old path of recursa.core.batch, kept for one release; import recursa.core.batch instead.

The `recursa batch` command (recursa.batch.cli) stays here with the other front ends.
"""

from recursa.core.batch import *  # noqa: F401,F403
