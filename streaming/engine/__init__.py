"""The engine: the one chunk loop (driver), the Flash session and samplers, the fixed pipelines,
saved workflows and the runner that turns a workflow into a stage list."""
