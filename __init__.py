"""alaya-flash: real-time generative G-buffer renderer.

This folder is both the Python package `alaya_flash` and a ComfyUI custom node pack: ComfyUI
imports it and reads NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS and WEB_DIRECTORY.
Importing it does no work: the node classes (and torch) load on the first read of the mappings,
so a light module such as `alaya_flash.client` (an engine's side of the live server) imports
without torch.
"""
__version__ = "0.1.0"
WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY", "__version__"]


def __getattr__(name: str):
    # PEP 562: hasattr/getattr (what ComfyUI uses) load the nodes on first use
    if name in ("NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"):
        from . import nodes

        return getattr(nodes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
