"""The package layout: one `alaya_flash` package, no stray top-level modules, a CLI with help."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from alaya_flash.streaming import cli

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_only_alaya_flash(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("alaya_flash-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"alaya_flash"}
    assert "alaya_flash/nodes/__init__.py" in names
    assert "alaya_flash/streaming/cli/__init__.py" in names
    assert "alaya_flash/client.py" in names  # an engine's client (docs/live.md, Engine ingest)
    assert not any(n.startswith("alaya_flash/tests/") for n in names)


def test_pack_exports_comfyui_mappings():
    import alaya_flash

    assert isinstance(alaya_flash.NODE_CLASS_MAPPINGS, dict)
    assert set(alaya_flash.NODE_DISPLAY_NAME_MAPPINGS) <= set(alaya_flash.NODE_CLASS_MAPPINGS)


def test_every_subcommand_has_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as exc:
            cli.main([name, "--help"])
        assert exc.value.code == 0
        assert name in capsys.readouterr().out
