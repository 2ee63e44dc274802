"""One module per `alaya-flash` subcommand.

Each module defines HELP (one line), add_arguments(parser) and run(args) -> int. Modules import
heavy dependencies (torch, av, mujoco) inside run(), so `alaya-flash --help` stays fast.
"""
