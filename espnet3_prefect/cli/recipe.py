"""ESPnet3 recipes from the shell: ``run`` (the recipe's launcher, parallel stages on Prefect) and the
recipe loading ``infer``/``metrics`` share (``--training-config``, ``--system``)::

    espnet3-prefect run --stages infer measure --training_config conf/training.yaml \\
        --inference_config conf/inference.yaml --metrics_config conf/metrics.yaml   [--system module.Class]
    espnet3-prefect infer --config conf/inference_parallel.yaml --training-config conf/training.yaml
    espnet3-prefect metrics --config conf/metrics.yaml --inference-config conf/inference_parallel.yaml \\
        --training-config conf/training.yaml

``run`` takes ESPnet3's launcher arguments unchanged (``--stages``, ``--<role>_config``, ``--dry_run``),
plus ``--rerun STAGE``; it is one flow run, ``recipe`` (:mod:`espnet3_prefect.recipe`). ``stages``, with the
same arguments, prints each stage: Cached, or why it would run; it starts nothing;
``--system`` defaults to the one system class of ``espnet3.systems.<this folder's name>.system``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.util import put_on_pythonpath
from espnet3_prefect.errors import ConfigError

SYSTEM_HELP = (
    "the ESPnet3 system class, module.Class (default: the system named like this folder, e.g. "
    "esp2_asr -> espnet3.systems.esp2_asr.system.ASRSystem)"
)


def register(sub) -> None:
    """``run`` and ``stages``: ESPnet3's launcher arguments, passed through to it (``--system`` ours)."""
    for name, handler, help_text in (
        ("run", run_recipe, "a recipe's stages as one Prefect flow run, a done stage Cached"),
        ("stages", show_stages, "each stage of a recipe: Cached (done) or why it would run; starts nothing"),
    ):
        parser = sub.add_parser(name, help=help_text, add_help=False)
        parser.add_argument("--system", default=None, help=SYSTEM_HELP)
        parser.set_defaults(handler=handler, passes_through=True)


def add_recipe_options(parser: argparse.ArgumentParser) -> None:
    """``--training-config`` and ``--system`` for ``infer``/``metrics`` inside an ESPnet3 recipe folder."""
    parser.add_argument(
        "--training-config",
        default=None,
        metavar="FILE",
        help="inside an ESPnet3 recipe: the training config whose exp_tag/exp_dir the launcher "
        "copies into this stage's config (as run.py --training_config does)",
    )
    parser.add_argument("--system", default=None, help=SYSTEM_HELP)


def run_recipe(args: argparse.Namespace) -> int:
    from espnet3_prefect.config.recipe_configs import system_from_path
    from espnet3_prefect.launch import default_system, launch

    # as `python run.py` in the recipe folder has it: that folder first on the path, so the recipe's own
    # `src` is found before the TEMPLATE's (path.sh puts both on PYTHONPATH), here and in its workers
    put_on_pythonpath(Path(os.getcwd()), first=True)
    system = system_from_path(args.system or default_system(Path(os.getcwd())))
    launch(system, argv=args.passed_through)
    return 0


def show_stages(args: argparse.Namespace) -> int:
    """``run --dry_run``: the stage table of what a run with these arguments would do."""
    if "--dry_run" not in args.passed_through:
        args.passed_through = [*args.passed_through, "--dry_run"]
    return run_recipe(args)


def stage_input(
    args: argparse.Namespace,
    role: str,
    configs: list[str],
    overrides: list[str],
    inference: tuple[list[str], list[str]] = ([], []),
) -> dict[str, Any] | None:
    """In an ESPnet3 recipe folder (espnet3 installed, TEMPLATE defaults for its system): ``{role: config,
    ["inference": config]}`` as the recipe's launcher loads them (:mod:`espnet3_prefect.config.recipe_configs`),
    each a resolved mapping for the flow; elsewhere None (files and overrides go to the flow as given)."""
    from espnet3_prefect.config.recipe_configs import load_recipe_configs, template_package

    package = template_package(configs[0], args.system) if configs else None
    if package is None:
        if args.training_config:
            raise ConfigError(
                "--training-config: only for an ESPnet3 recipe (espnet3 installed, the config in the "
                "recipe's conf/, the recipe folder named after its system or --system module.Class)"
            )
        return None
    return load_recipe_configs(
        role,
        configs,
        overrides,
        package,
        training=[args.training_config] if args.training_config else [],
        inference=inference[0],
        inference_overrides=inference[1],
    )


__all__ = ["add_recipe_options", "register", "run_recipe", "show_stages", "stage_input"]
