"""Saved workflows: only existing node types with valid inputs, in both formats; UI -> API = the API twin."""
import json
from pathlib import Path

import pytest

from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
from alaya_flash.nodes import NODE_DISPLAY_NAME_MAPPINGS as NAMES
from alaya_flash.streaming.render import runner as rn
from alaya_flash.streaming.render import workflow as wfm

WORKFLOWS = Path(__file__).resolve().parents[1] / "workflows"
API = WORKFLOWS / "api"
NAMES_REQUIRED = ("render-gbuffer-sequence", "render-teacher", "physics-world-demo", "teacher-vs-flash", "live-preview",
                  "render-gbuffer-videos", "render-long-clip")


@pytest.fixture(autouse=True)
def gbuffer_input(tmp_path, monkeypatch):
    """Load G-Buffers' default path (gbuffers/clip) exists, relative to the working folder."""
    (tmp_path / "gbuffers" / "clip").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", NAMES_REQUIRED)
def test_workflow_pair_is_valid_and_ui_converts_to_api_twin(name):
    ui_data = json.loads((WORKFLOWS / f"{name}.json").read_text())
    api_data = json.loads((API / f"{name}.json").read_text())
    ui = wfm.parse_workflow(ui_data, NODES, name)
    api = wfm.parse_workflow(api_data, NODES, name)
    assert ui.format == "ui" and api.format == "api"
    wfm.validate(ui, NODES)
    wfm.validate(api, NODES)
    rn.StreamRunner(api, NODES)  # stream roles fit: one source, no run-once node fed a stream
    assert ui.to_api() == api.to_api()
    # every node type exists, every UI node names a real class and lies on the canvas without overlap
    assert {n["type"] for n in ui_data["nodes"]} <= set(NODES)
    boxes = [(n["pos"][0], n["pos"][1], n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1]) for n in ui_data["nodes"]]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (name, a, b)


def test_no_stray_workflow_files():
    """One folder: the UI files at the top (ComfyUI lists workflows/*.json as the pack's templates, not its
    subfolders), their API twins in api/, and no second copy anywhere (graphs/, example_workflows/)."""
    assert {p.name for p in WORKFLOWS.glob("*.json")} == {f"{n}.json" for n in NAMES_REQUIRED}
    assert {p.name for p in API.glob("*.json")} == {f"{n}.json" for n in NAMES_REQUIRED}
    for folder in ("graphs", "example_workflows", "example", "examples", "workflow"):
        assert not (WORKFLOWS.parent / folder).exists(), f"{folder}/ would be a second copy or template folder"


def test_every_template_has_its_thumbnail():
    """ComfyUI's template browser shows workflows/NAME.jpg beside each NAME.json (a 404 is a blank card):
    a small JPEG, rendered from the workflow itself by integrations/comfyui/make_workflows.py --thumbnails."""
    from PIL import Image

    assert {p.stem for p in WORKFLOWS.glob("*.jpg")} == {p.stem for p in WORKFLOWS.glob("*.json")}
    for path in WORKFLOWS.glob("*.jpg"):
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and im.height == 160 and 160 <= im.width <= 640, path
            assert max(im.getextrema()[0]) - min(im.getextrema()[0]) > 50, f"{path} is blank"  # a picture, not a fill
        assert path.stat().st_size < 64 * 1024, path


def test_node_pack_conventions():
    for node_id, cls in NODES.items():
        assert node_id.startswith("AlayaFlash_") and node_id in NAMES
        assert cls.CATEGORY.startswith("alaya-flash/") and cls.DESCRIPTION
        for section in ("required", "optional"):
            for name, spec in (cls.INPUT_TYPES().get(section) or {}).items():
                assert len(spec) > 1 and spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
        assert hasattr(cls, cls.FUNCTION)


def test_generator_output_is_what_is_saved(tmp_path, monkeypatch):
    """workflows/ is what integrations/comfyui/make_workflows.py writes (no hand edits drifting from it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_workflows", WORKFLOWS.parent / "integrations" / "comfyui" / "make_workflows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, graph in mod.WORKFLOWS.items():
        assert mod.to_api(graph, NODES) == json.loads((API / f"{name}.json").read_text())
        assert mod.to_ui(graph, NODES) == json.loads((WORKFLOWS / f"{name}.json").read_text())
    assert set(mod.WORKFLOWS) == set(NAMES_REQUIRED)


def test_every_workflow_runs_as_shipped_on_the_bundled_sample(tmp_path, monkeypatch):
    """The saved render workflow opens with working defaults: its Load G-Buffers path is the pack's
    bundled sample clip, found from any folder (no other file needed for a first run)."""
    from alaya_flash.streaming.cli import main

    monkeypatch.chdir(tmp_path)  # not the repo: samples/courtyard is found in the pack
    api = json.loads((API / "render-gbuffer-sequence.json").read_text())
    load = next(n for n in api.values() if n["class_type"] == "AlayaFlash_LoadGBuffers")
    assert load["inputs"]["path"] == "samples/courtyard"
    assert main(["--quiet", "run", str(API / "render-gbuffer-sequence.json"), "--set", "2.model=random:tiny",
                 "--set", "Save.filename=out.mp4"]) == 0
    import av

    with av.open(str(tmp_path / "out.mp4")) as f:
        assert sum(1 for _ in f.decode(video=0)) == 17


def test_node_reference_lists_every_node():
    text = (WORKFLOWS.parent / "docs" / "nodes.md").read_text()
    for node_id in NODES:
        assert f"(`{node_id}`)" in text, f"docs/nodes.md lacks {node_id}; run integrations/comfyui/node_reference.py"
