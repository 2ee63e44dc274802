"""ComfyUI nodes (classic V1 API), ids prefixed "AlayaFlash_", categories under "alaya-flash/".

Thin: each node validates its inputs and calls one stage or function of streaming/ or model_zoo/.
Stream roles (STREAM = "source" / "stage") follow docs/runner.md, so the same classes run in
ComfyUI (once over the whole sequence) and in `alaya-flash run` (chunk by chunk). Every comfy
import is guarded (nodes/comfy.py), so the pack imports and its tests run without ComfyUI.
Reference: docs/nodes.md.
"""
from . import gbuffers, light, models, output, render, stream

_ALL = {**gbuffers.NODES, **models.NODES, **render.NODES, **stream.NODES, **light.NODES, **output.NODES}

NODE_CLASS_MAPPINGS: dict[str, type] = {node_id: cls for node_id, (cls, _) in _ALL.items()}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {node_id: name for node_id, (_, name) in _ALL.items()}
