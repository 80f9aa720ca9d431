"""A recipe run built by ESPnet3's own launcher, up to the point where it would run the stages.

ESPnet3's ``launch(system_cls, conf_package=, argv=, parser=)`` parses ``--stages`` and the
``--<role>_config`` files, loads each config with the system's TEMPLATE defaults, copies the
experiment context between them, resolves them, builds the system and then calls ``run_stages``. Here
that last call is taken instead of made: what it was given (the system, the resolved stages, the
arguments, the logger) becomes a :class:`~espnet3_prefect.recipe.driver.RecipeRun`, and each stage
later runs through ESPnet3's own ``run_stages`` for that one stage. Nothing of the launcher is written
again, and a config mistake surfaces here, before a server starts.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.recipe.driver import RecipeRun

RERUN_HELP = "rerun STAGE and every later stage of this run even when done ('all': every stage)"


def recipe_parser(system_cls: type, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """ESPnet3's launcher parser for ``system_cls`` (or the recipe's own) with ``--rerun`` added."""
    launcher = _espnet3_module("espnet3.systems.launch")
    parser = parser or launcher.build_parser(system_cls)
    if not any("--rerun" in action.option_strings for action in parser._actions):
        names = [spec.name for spec in system_cls.stages]
        parser.add_argument("--rerun", nargs="+", default=[], choices=[*names, "all"], metavar="STAGE", help=RERUN_HELP)
    return parser


def load_recipe(
    system_cls: type,
    *,
    conf_package: str | None = None,
    argv: Sequence[str] | None = None,
    parser: argparse.ArgumentParser | None = None,
) -> RecipeRun:
    """Run ESPnet3's launcher for ``system_cls`` up to its stages; returns the run they make."""
    launcher = _espnet3_module("espnet3.systems.launch")
    taken: dict[str, Any] = {}

    def take(system, stages_to_run, args=None, log=None):
        taken.update(system=system, stages=list(stages_to_run), args=args, log=log)

    run_stages = launcher.run_stages
    launcher.run_stages = take
    try:
        launcher.launch(system_cls, conf_package=conf_package, argv=argv, parser=recipe_parser(system_cls, parser))
    finally:
        launcher.run_stages = run_stages
    if not taken:
        raise ConfigError("launch: ESPnet3's launcher returned without reaching its stages")
    system, args, log = taken["system"], taken["args"], taken["log"]

    def run_stage(stage: str) -> None:
        run_stages(system=system, stages_to_run=[stage], args=args, log=log)

    root = Path.cwd()
    roles = [name[: -len("_config")] for name in vars(args) if name.endswith("_config")]
    return RecipeRun(
        name=f"{root.parent.name}/{root.name}",
        system=system,
        stages=taken["stages"],
        rerun=list(getattr(args, "rerun", None) or []),
        root=root,
        run_stage=run_stage,
        dry_run=bool(getattr(args, "dry_run", False)),
        configs={role: str(getattr(args, f"{role}_config")) for role in roles if getattr(args, f"{role}_config")},
    )


def default_system(recipe_dir: Path) -> str:
    """The system of a recipe folder named after it, as ESPnet3 lays them out (``egs3/<corpus>/<system>``):
    the one system class in ``espnet3.systems.<folder name>.system``."""
    module_name = f"espnet3.systems.{recipe_dir.name}.system"
    try:
        module = importlib.import_module(module_name)
        base = importlib.import_module("espnet3.systems.base.system").BaseSystem
    except ImportError:
        raise ConfigError(
            f"--system: not given, and {recipe_dir.name!r} (this folder's name) is not an ESPnet3 "
            f"system ({module_name} does not import); pass --system module.Class"
        ) from None
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, base) and obj is not base and obj.__module__ == module_name
    ]
    if len(found) != 1:
        raise ConfigError(f"--system: {module_name} defines {len(found)} system classes; pass --system module.Class")
    return f"{module_name}.{found[0].__name__}"


#: how a system class becomes one whose infer, measure and collect_stats run on Prefect: set by
#: :mod:`espnet3_prefect.launch` (``on_prefect``) when the package is imported, the one way up at run time
_on_prefect: Callable[[type], type] | None = None


def set_system_wrapper(wrap: Callable[[type], type]) -> None:
    global _on_prefect
    _on_prefect = wrap


def recipe_from_parameters(
    stages: Sequence[str], configs: dict[str, str], rerun: Sequence[str] = (), system: str | None = None
) -> RecipeRun:
    """The run a deployment's parameters describe, in the recipe folder (the current one): the same
    launcher arguments ``espnet3-prefect run`` takes (``configs``: ``{role: file}``)."""
    from espnet3_prefect.config.recipe_configs import system_from_path

    if _on_prefect is None:
        raise ConfigError("recipe: espnet3_prefect.launch is not imported")
    argv = ["--stages", *stages]
    for role, path in configs.items():
        argv += [f"--{role}_config", str(path)]
    if rerun:
        argv += ["--rerun", *rerun]
    system_cls = system_from_path(system or default_system(Path.cwd()))
    return load_recipe(_on_prefect(system_cls), argv=argv)


def _espnet3_module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(
            f'launch: ESPnet3\'s launcher does not import ({exc}); pip install "espnet[asr]==202611"'
        ) from None


__all__ = ["default_system", "load_recipe", "recipe_from_parameters", "recipe_parser", "set_system_wrapper"]
