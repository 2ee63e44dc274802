"""How frames flow. gbuffer.py: the G-buffer encoding every part shares; values.py: the values that
flow between stages (G-buffer chunks, latents, prompt schedules); metrics.py: frame metrics; files/:
G-buffer files in, frames out; world/: the physics world source; render/: the one chunk loop, the
samplers, the pipelines, the workflow runner; live/: the live page server; cli/: `alaya-flash`.
Layers and the import rule: docs/architecture.md."""
