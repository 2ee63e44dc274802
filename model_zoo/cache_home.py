"""Where the project keeps what a later process can reuse (compiled models, prompt encodings)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """$ALAYA_FLASH_CACHE, else $XDG_CACHE_HOME/alaya-flash, else ~/.cache/alaya-flash."""
    if os.environ.get("ALAYA_FLASH_CACHE"):
        return Path(os.environ["ALAYA_FLASH_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alaya-flash"
