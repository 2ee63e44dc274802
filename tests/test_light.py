"""The Light value: parsing what users type, refusing what cannot be a light, the packed form, presets."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.model_zoo.light import PACKED, Light, pack, unpack


def test_short_form_and_json_read_the_same_light():
    short = Light.parse("az=-90,el=30,sun=3:2.5:2,horizon=0.8,fog_density=0.02,exposure=1.2")
    as_json = Light.parse('{"sun_azimuth": -90, "sun_elevation": 30, "sun_color": [3, 2.5, 2], '
                          '"sky_horizon": [0.8, 0.8, 0.8], "fog_density": 0.02, "exposure": 1.2}')
    assert short == as_json
    assert short.sun_azimuth == -90 and short.sky_horizon == (0.8, 0.8, 0.8)
    assert short.sky_zenith == Light().sky_zenith  # what it does not name keeps the default


def test_a_named_base_light_takes_overrides():
    named = {"dusk": Light(sun_elevation=5.0, sun_color=(3.0, 1.0, 0.3))}
    light = Light.parse("dusk,az=45", named=named)
    assert (light.sun_elevation, light.sun_azimuth, light.sun_color) == (5.0, 45.0, (3.0, 1.0, 0.3))


@pytest.mark.parametrize("text, words", [
    ("az=nan", "sun_azimuth must be a finite number"),
    ("el=91", "sun_elevation 91.0 is outside [-90, 90]"),
    ("el=-90.5", "outside [-90, 90]"),
    ("colour=1", "unknown light key 'colour'"),
    ('{"sun": 1}', "unknown light key 'sun'"),
    ('{"sun_color": [1, 2]}', "sun_color must be 3 numbers"),
    ('{"sun_color": [1, -2, 3]}', "outside [0, 1000]"),
    ('{"fills": [[10, 20, [1, 1, 1]], [1, 2, [1, 1, 1]], [1, 2, [1, 1, 1]]]}', "at most 2"),
    ("{nope", "malformed JSON"),
    ("sunny", "neither key=value nor a named light"),
    ("az=1:2", "takes one number"),
    ("sun=a:b:c", "is not a number or r:g:b"),
    ("exposure=0", "outside"),
    ("", "empty"),
    ("[1, 2]", "neither key=value"),
])
def test_what_cannot_be_a_light_is_one_line_naming_it(text, words):
    with pytest.raises(AlayaError) as err:
        Light.parse(text, where="--light")
    assert words in str(err.value) and str(err.value).startswith("--light: ")
    assert "\n" not in str(err.value)


def test_the_packed_form_round_trips():
    light = Light(sun_azimuth=-30.0, sun_elevation=12.5, fills=((15.0, 120.0, (0.2, 1.6, 2.0)),), fog_density=0.03)
    packed = pack([light, Light()])
    assert packed.shape == (2, PACKED)
    back = unpack(packed)
    assert np.allclose(pack(back), packed)  # float32 both ways: the same vector
    assert back[0].sun_azimuth == -30.0 and back[0].fills[0][:2] == (15.0, 120.0)
    assert back[1].fills == ()  # absent fills (no colour) are dropped again


def test_a_physics_world_preset_becomes_a_camera_relative_light():
    from alaya_flash.streaming.world.shading import PRESETS, light_of

    sunny = PRESETS["bright_sunny"]
    light = light_of("bright_sunny", camera_heading=sunny.sun_azimuth)  # looking straight at the sun
    assert light.sun_azimuth == 0.0 and light.sun_elevation == sunny.sun_elevation
    behind = light_of("bright_sunny", camera_heading=sunny.sun_azimuth + 180.0)
    assert abs(behind.sun_azimuth) == 180.0
    neon = light_of("cyberpunk_neon", camera_heading=0.0)
    assert len(neon.fills) == 2 and neon.fog_density == PRESETS["cyberpunk_neon"].fog_density


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["az", "el", "sun", "ambient", "fog_density", "exposure", "zenith"]),
                       st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=4))
def test_any_short_form_is_a_valid_light_or_one_line(values):
    text = ",".join(f"{k}={v}" for k, v in values.items()) or "az=0"
    try:
        light = Light.parse(text)
    except AlayaError as err:
        assert "\n" not in str(err)
        return
    assert light.validate() is light
    assert all(math.isfinite(x) for x in pack(light)[0].tolist())
