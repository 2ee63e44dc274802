"""How frames flow. gbuffer.py: the G-buffer encoding every part shares; metrics.py: frame metrics;
files/: G-buffer files in, frames out; world/: the physics world source; engine/: the one chunk loop,
sessions, pipelines, the workflow runner; live/: the live page server; cli/: `alaya-flash`.
Layers and the import rule: docs/architecture.md."""
