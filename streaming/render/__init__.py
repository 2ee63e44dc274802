"""Rendering: the one chunk loop (driver), the samplers, the stages and the fixed pipelines built
from them, light schedules, saved workflows and the runner that turns a workflow into a stage list."""
