"""How frames flow: G-buffer conventions, sources, sessions, pipelines, sinks, runner, CLI."""
