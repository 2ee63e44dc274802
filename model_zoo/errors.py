"""The one exception type for problems a user can fix (bad files, bad options, bad keys).

The CLI prints these as one line and exits non-zero; anything else is a bug and keeps its
traceback. Messages name the file, key, node or value and say what is wrong.
"""


class AlayaError(Exception):
    """A user-facing error: one line naming what is wrong and where."""


class CheckpointError(AlayaError):
    """A weight file that does not match the network it is loaded into."""
