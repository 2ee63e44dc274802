"""ComfyUI nodes (classic V1 API). Thin: each validates its inputs and calls one function of
streaming/ or model_zoo/. Every comfy import is guarded so the pack imports without ComfyUI."""

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
