"""json.loads for what users hand us (config.json, camera.json, shot lists, indexes).

Python's decoder raises RecursionError, not a ValueError, for JSON nested deeper than its
recursion limit ('[' * 3000 is 3 KB): every reader's `except ValueError` missed it and the CLI
printed a traceback. Here it is a JSONDecodeError like any other malformed JSON.
"""
from __future__ import annotations

import json


def loads(text: str | bytes, **kwargs):
    """json.loads(text, **kwargs); JSON nested too deeply raises json.JSONDecodeError (a ValueError)."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text if isinstance(text, str) else "", 0) from None
