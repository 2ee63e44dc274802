"""AlayaRenderer's prompt styles (model_zoo/styles.py): the caption's content kept, its lighting swapped
for a named style's, as AlayaRenderer's inference script does; `render --style` and Encode Prompt's input."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.model_zoo.styles import ORIGINAL, STYLES, content_of, styled
from alaya_flash.streaming.cli import main

ROOT = Path(__file__).resolve().parents[1]
MOON = STYLES["moonlit_night"]


def test_the_named_styles_are_alayarenderers():
    assert list(STYLES) == ["original", "bright_sunny", "snowy_winter", "sunset_dramatic", "cyberpunk_neon",
                            "underwater", "autumn_warm", "moonlit_night"]
    assert STYLES[ORIGINAL] is None
    for name, hint in STYLES.items():  # each hint is itself a lighting part: "the scene is ..., creating a(n) ... atmosphere."
        assert hint is None or (hint.startswith("the scene is ") and "creating a" in hint and hint.endswith("atmosphere.")), name


@pytest.mark.parametrize("caption, content", [
    # 1. "; the scene is|feels|appears": the usual caption
    ("A warrior crosses a temple courtyard; the scene is lit by soft morning light, creating a calm atmosphere.",
     "A warrior crosses a temple courtyard"),
    ("Two monks talk; the scene feels cold, creating a tense atmosphere", "Two monks talk"),
    # the same after a comma, when no semicolon clause exists
    ("A monk in red robes, the scene appears gloomy and overcast, creating a somber atmosphere.", "A monk in red robes"),
    # a semicolon clause wins over an earlier comma one
    ("A gate, the scene is dark at first; the scene is lit by torches, creating an eerie atmosphere.",
     "A gate, the scene is dark at first"),
    # 2. no scene clause: cut at ", creating a(n) WORD", with a trailing lighting clause before it
    ("A stone bridge over a river, under low, diffuse lighting, creating a mysterious atmosphere.", "A stone bridge over a river"),
    ("A bridge; Illuminated by lanterns; creating an eerie mood", "A bridge"),
    ("A quiet village, creating a peaceful atmosphere.", "A quiet village"),
    # 3. neither: the whole caption
    ("A lone tree on a hill.", None),
])
def test_content_is_found_as_alayarenderers_script_finds_it(caption, content):
    assert content_of(caption) == content
    want = (content if content is not None else caption.rstrip(".")) + "; " + MOON
    assert styled(caption, "moonlit_night") == want
    assert styled(caption, ORIGINAL) == caption


def test_an_unknown_style_is_one_line():
    with pytest.raises(AlayaError, match="style 'noir' is not one of AlayaRenderer's: original, bright_sunny"):
        styled("a street", "noir")


def test_encode_prompt_styles_each_scheduled_prompt():
    from alaya_flash.nodes.models import EncodePrompt

    seen = []

    def encoder(prompts):
        seen.extend(prompts)
        return torch.zeros(len(prompts), 1, 4)

    encoder.text_dim = 4
    (schedule,) = EncodePrompt().encode(encoder, "0: a gate; the scene is dim, creating a calm atmosphere.\n8: a hall",
                                        style="snowy_winter")
    assert seen == [f"a gate; {STYLES['snowy_winter']}", f"a hall; {STYLES['snowy_winter']}"]
    assert [t for _, t, _ in schedule.entries] == seen
    assert "style" in EncodePrompt.INPUT_TYPES()["optional"] and EncodePrompt.INPUT_TYPES()["optional"]["style"][0] == list(STYLES)


def frames(folder: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p)) for p in sorted(folder.glob("*.png"))])


def test_render_style_equals_rendering_the_restyled_prompt(tmp_path, capsys):
    caption = "colourful toys in a courtyard; the scene is lit by a grey overcast sky, creating a dull atmosphere."
    args = ["--quiet", "render", str(ROOT / "samples" / "courtyard"), "--format", "png", "--size", "64", "--frames", "4"]
    assert main([*args, "--prompt", caption, "--style", "sunset_dramatic", "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--prompt", styled(caption, "sunset_dramatic"), "--out", str(tmp_path / "b")]) == 0
    assert main([*args, "--prompt", caption, "--out", str(tmp_path / "c")]) == 0
    a, b, c = frames(tmp_path / "a"), frames(tmp_path / "b"), frames(tmp_path / "c")
    assert a.shape[0] == 4 and np.array_equal(a, b) and not np.array_equal(a, c)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["render", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"one of {', '.join(STYLES)}" in help_text  # the named styles, listed by --help
