"""Light nodes: a Light made on the canvas (or read from a prompt), and G-buffers shaded with it.

Light (Alaya Flash) gives a LIGHT (streaming/render/lighting.py LightSchedule), which Refine with G-Buffers
and Render G-Buffer Stream pass to a refiner that reads the light (nodes/render.py): a named preset, the
sun's direction relative to the camera and its colour as widgets, or a text light (JSON, key=value
pairs, 'FRAME: light' keyframes) that wins over the widgets. Light From Prompt reads one with the
light head (model_zoo/light_head.py). Shade G-Buffers lights the passes with the shading prior alone
(model_zoo/shading_prior.py): a lighting preview, and what the networks will read as their light.
"""
from __future__ import annotations

from .base import Piecewise, StageNode, refuse
from .gbuffers import GBUFFERS
from .render import LIGHT, MOST_FRAMES, _last_frame, _Single

CATEGORY = "alaya-flash/light"
CUSTOM = "custom"


def _named():
    from ..streaming.world.traced.presets import named_lights

    return named_lights()


class Light:
    DESCRIPTION = ("A light for Refine with G-Buffers and Render G-Buffer Stream (a model whose refiner reads the "
                   "light renders under it instead of the prompt's) and for Shade G-Buffers: a "
                   "preset's sun, sky and fog with the sun placed by azimuth (0 ahead of the camera, 90 left, 180 "
                   "behind, -90 right) and elevation; 'text' (JSON, key=value pairs such as az=90,el=30, or "
                   "'FRAME: light' lines the light moves through) wins over the widgets when not empty.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (LIGHT,)
    RETURN_NAMES = ("light",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "preset": ([CUSTOM, *_named()], {"default": "bright_sunny", "tooltip": "Sun colour, sky, fog and exposure of a lighting preset (custom: the defaults below)."}),
            "sun_azimuth": ("FLOAT", {"default": 135.0, "min": -180.0, "max": 180.0, "step": 1.0, "tooltip": "Degrees about the up axis: 0 the sun ahead (backlit), 90 left, 180 behind the camera, -90 right."}),
            "sun_elevation": ("FLOAT", {"default": 45.0, "min": -90.0, "max": 90.0, "step": 1.0, "tooltip": "Degrees above the horizon."}),
            "sun_intensity": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 100.0, "step": 0.05, "tooltip": "Scales the preset's sun colour."}),
            "exposure": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.05, "tooltip": "0: the preset's own exposure."}),
        }, "optional": {
            "text": ("STRING", {"default": "", "multiline": True, "tooltip": "A light as text (JSON, key=value pairs, or 'FRAME: light' lines); wins over the widgets."}),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, text=""):
        from ..model_zoo.errors import AlayaError
        from ..streaming.render.lighting import LightSchedule

        if text and text.strip():
            try:
                LightSchedule.parse(text, "Light (Alaya Flash): text", named=_named())
            except AlayaError as err:
                return str(err)
        return True

    def make(self, preset, sun_azimuth, sun_elevation, sun_intensity, exposure, text=""):
        from ..model_zoo.light import Light as LightValue
        from ..streaming.render.lighting import LightSchedule

        where = "Light (Alaya Flash)"
        if text and text.strip():
            return (LightSchedule.parse(text, f"{where}: text", named=_named()),)
        base = _named()[preset] if preset != CUSTOM else LightValue()
        light = base.replace(sun_azimuth=sun_azimuth, sun_elevation=sun_elevation,
                             sun_color=tuple(c * sun_intensity for c in base.sun_color),
                             exposure=exposure or base.exposure).validate(where)
        return (LightSchedule.constant(light),)


class LightFromPrompt:
    DESCRIPTION = ("The light a prompt asks for, read by the light head: the nearest lighting preset and the sun's "
                   "side ('with the sun on the left'); a schedule's entries each give theirs from their frame on.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (LIGHT,)
    RETURN_NAMES = ("light",)
    FUNCTION = "read"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "a sunny street, with the sun on the left", "multiline": True,
                                                 "tooltip": "A prompt, or lines 'FRAME: prompt'."})}}

    def read(self, text):
        from ..model_zoo import light_head
        from ..model_zoo.text_encoder import TextEncoder
        from ..streaming.render.lighting import LightSchedule

        return (LightSchedule.from_prompts(text, light_head.load(), TextEncoder.load()),)


class ShadeGBuffers(StageNode):
    DESCRIPTION = ("Light G-buffers with the shading prior alone (no network): GGX and Lambert under the LIGHT's sun, "
                   "cast shadows (the G-buffers' shadow pass when they carry one, else screen-space), ambient occlusion "
                   "(their sky pass when they carry one, else screen-space), the sky on background pixels and depth fog.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("gbuffers",)
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "gbuffers": (GBUFFERS, {"tooltip": "G-buffer frames."}),
            "light": (LIGHT, {"tooltip": "From Light or Light From Prompt."}),
            "fov": ("FLOAT", {"default": 60.0, "min": 1.0, "max": 179.0, "step": 1.0, "tooltip": "Vertical field of view of the camera, degrees."}),
        }}

    def start_stream(self, light, fov):
        from ..model_zoo.shading_prior import PriorConfig, ShadingPrior
        from ..streaming.render.lighting import LightSchedule, Shade

        refuse("Shade G-Buffers", [None if isinstance(light, LightSchedule)
                                   else f"light must come from a Light node, got {type(light).__name__}"])
        return Piecewise(_Single(Shade(light, ShadingPrior(PriorConfig(fov_y=fov))), to_image=True), MOST_FRAMES,
                         _last_frame)


NODES = {
    "AlayaFlash_Light": (Light, "Light (Alaya Flash)"),
    "AlayaFlash_LightFromPrompt": (LightFromPrompt, "Light From Prompt (Alaya Flash)"),
    "AlayaFlash_ShadeGBuffers": (ShadeGBuffers, "Shade G-Buffers (Alaya Flash)"),
}
