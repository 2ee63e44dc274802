"""The package layout: one `alaya_flash` package, no stray top-level modules, a CLI with help."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from alaya_flash.streaming import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
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
    # the saved workflows travel: the UI files with their thumbnails (ComfyUI's templates), the API twins
    for file in [*ROOT.glob("workflows/*.json"), *ROOT.glob("workflows/*.jpg"), *ROOT.glob("workflows/api/*.json")]:
        assert f"alaya_flash/{file.relative_to(ROOT).as_posix()}" in names, file
    # every model folder shipped in model_zoo/ travels whole: its config and every weight file, teacher/ too
    from alaya_flash.model_zoo.bundle import shipped_models

    shipped = shipped_models()
    assert "default" in shipped
    for name, folder in shipped.items():
        for file in [*folder.glob("*.json"), *folder.glob("*.safetensors"), *folder.glob("teacher/*")]:
            assert f"alaya_flash/model_zoo/{name}/{file.relative_to(folder).as_posix()}" in names, file


def test_model_argument_takes_a_shipped_models_name(tmp_path, monkeypatch):
    """--model NAME finds model_zoo/NAME from any directory; a path that exists wins; anything else is
    left as given, for the command to name what is missing."""
    from alaya_flash.model_zoo.bundle import DEFAULT_DIR, shipped_models
    from alaya_flash.streaming.cli.args import SHIPPED_MODEL_HELP, model_path

    monkeypatch.chdir(tmp_path)
    assert shipped_models()["default"] == DEFAULT_DIR
    assert model_path("default") == DEFAULT_DIR
    (tmp_path / "default").mkdir()  # a folder of the user's of that name is theirs
    assert model_path("default") == Path("default")
    assert model_path("nonesuch") == Path("nonesuch") and model_path("a/default") == Path("a/default")
    assert all((folder / "config.json").is_file() for folder in shipped_models().values())
    # every command that takes --model resolves it the same way
    import argparse

    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for command in ("render", "eval", "demo", "serve", "bench"):
        (action,) = [a for a in sub.choices[command]._actions if "--model" in a.option_strings]
        assert action.type is model_path, command
        assert action.help.startswith(SHIPPED_MODEL_HELP), command
    # the help names exactly the folders shipped
    listed = SHIPPED_MODEL_HELP[SHIPPED_MODEL_HELP.index("(") + 1:SHIPPED_MODEL_HELP.index(")")]
    assert sorted(listed.split(", ")) == sorted(shipped_models())


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
