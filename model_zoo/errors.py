"""The one exception type for problems a user can fix (bad files, bad options, bad keys).

The CLI prints these as one line and exits non-zero; anything else is a bug and keeps its
traceback. Messages name the file, key, node or value and say what is wrong.
"""


# The pack's import name as loaded: alaya_flash, or, in ComfyUI, the custom node folder's path (ComfyUI
# imports a folder under its path, which then showed in every error's type name on the canvas).
_ROOT = __name__.removesuffix(".model_zoo.errors")


def public_module(name: str) -> str:
    """A module name as `alaya_flash.…`, whatever name the package was imported under."""
    return "alaya_flash" + name[len(_ROOT):] if name == _ROOT or name.startswith(_ROOT + ".") else name


class AlayaError(Exception):
    """A user-facing error: one line naming what is wrong and where."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.__module__ = public_module(cls.__module__)  # its type name never carries an install path


AlayaError.__module__ = public_module(__name__)


class CheckpointError(AlayaError):
    """A weight file that does not match the network it is loaded into."""
