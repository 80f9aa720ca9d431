"""``infer``, ``metrics`` and ``evaluate``: one stage (or both) as a flow run in this process.

espnet3-prefect infer    --config conf/inference.yaml [deployments/parallel_local.yaml] [key=value ...]
espnet3-prefect metrics  --config conf/metrics.yaml [key=value ...] [--inference-config conf/inference.yaml ...]
espnet3-prefect evaluate --config conf/inference.yaml [parallel.yaml] --metrics-config conf/metrics.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from espnet3_prefect.cli.common import (
    add_config,
    add_server_options,
    add_verbose,
    configs_of,
    console_skips_summary,
    run_stage,
    split_args,
)
from espnet3_prefect.cli.recipe import add_recipe_options, stage_input


def register(sub) -> argparse.ArgumentParser:
    """Add the three stage commands to ``sub``; returns the ``infer`` parser (``--detach`` joins it)."""
    infer = sub.add_parser("infer", help="run the infer stage (flow 'infer')")
    add_config(infer)
    add_recipe_options(infer)
    add_server_options(infer)
    add_verbose(infer)
    infer.set_defaults(handler=run_infer)

    metrics = sub.add_parser("metrics", help="run the metrics stage (flow 'metrics')")
    add_config(metrics, help="metrics config files merged left to right, then key=value overrides")
    metrics.add_argument(
        "--inference-config",
        nargs="+",
        default=[],
        metavar="FILE_OR_OVERRIDE",
        help="inference config files, then key=value overrides: the test sets dataset:<column> "
        "inputs read (and inference_dir when the metrics config has none)",
    )
    add_recipe_options(metrics)
    add_server_options(metrics)
    add_verbose(metrics)
    metrics.set_defaults(handler=run_metrics)

    evaluate = sub.add_parser("evaluate", help="infer then metrics, with a score history (flow 'evaluate')")
    add_config(evaluate, help="inference config files, then key=value overrides for infer", extra=False)
    add_config(
        evaluate, "--metrics-config", help="metrics config files, then key=value overrides for metrics", extra=False
    )
    evaluate.add_argument(
        "--checkpoint",
        default=None,
        metavar="FILE",
        help="evaluate this checkpoint: its path fills --checkpoint-key of the inference config; "
        "recorded (path, sha256, epoch, step) with the scores, scored once per content",
    )
    evaluate.add_argument(
        "--checkpoint-key",
        default=None,
        metavar="KEY",
        help="the model-config key the checkpoint fills (default: the recipe's, e.g. "
        "model.asr_model_file; the demo's model.model_file)",
    )
    add_server_options(evaluate)
    add_verbose(evaluate)
    evaluate.set_defaults(handler=run_evaluate)
    return infer


def infer_input(args: argparse.Namespace) -> tuple:
    """``(config, overrides)`` for the flow ``infer``: the files and overrides as given, or inside an
    ESPnet3 recipe folder the config its launcher would load, resolved (overrides applied)."""
    configs, overrides = configs_of(args)
    recipe = stage_input(args, "inference", configs, overrides)
    if recipe is not None:
        return recipe["inference"], []
    return [str(Path(c)) for c in configs], overrides


def run_infer(args: argparse.Namespace) -> int:
    config, overrides = infer_input(args)
    plans, done = [], []  # the run's plan, built once by validate() and handed to the flow

    def validate():
        from espnet3_prefect.config.load import load_config_input
        from espnet3_prefect.pipeline.run_plan import plan_run

        plan = plan_run(load_config_input(config, overrides))
        plan.preflight()
        plans.append(plan)
        done.append(plan.complete())
        if done[0] is None:  # work to do: the demo's data, then input_key, before a server starts
            plan.check_inputs()

    def settled():
        return done[0]

    def run():
        from espnet3_prefect.flows.infer import infer

        with console_skips_summary():
            return infer(config=config, overrides=overrides, plan=plans[0])

    def show(summaries):
        from espnet3_prefect.pipeline.report import format_summary

        print(format_summary(summaries))

    def writers():
        from espnet3_prefect.server.run_links import writer_runs

        return writer_runs(stage.out_dir for stage in plans[0].stages)

    def starting():
        from espnet3_prefect.flows.workers import INFER_FORKSERVER_PRELOAD, fork_server_beside

        return fork_server_beside(plans[0].spec, plans[0].stages, INFER_FORKSERVER_PRELOAD)

    return run_stage(args, validate=validate, run=run, show=show, settled=settled, writers=writers, starting=starting)


def run_metrics(args: argparse.Namespace) -> int:
    configs, overrides = configs_of(args)
    i_configs, i_overrides = split_args(args.inference_config)
    recipe = stage_input(args, "metrics", configs, overrides, inference=(i_configs, i_overrides))
    if recipe is not None:  # an ESPnet3 recipe: each config as its launcher loads it, resolved
        configs, overrides = recipe["metrics"], []
        i_configs, i_overrides = recipe.get("inference"), []
    prepared = []

    def validate():
        from espnet3_prefect.metrics.prepare import load_any, load_inference_config, prepare_metrics

        prepared.append(
            prepare_metrics(
                load_any(configs, overrides), inference_config=load_inference_config(i_configs, i_overrides)
            )
        )

    def settled():
        from espnet3_prefect.metrics.record import settled_results

        return settled_results(prepared[0])

    def run():
        from espnet3_prefect.flows.metrics import metrics

        return metrics(
            config=configs, overrides=overrides, inference_config=i_configs or None, inference_overrides=i_overrides
        )

    def show(results):
        for key, per_test in results.items():
            for test_set, result in per_test.items():
                print(f"{test_set}: {key}: {json.dumps(result)}")

    return run_stage(args, validate=validate, run=run, show=show, settled=settled)


def run_evaluate(args: argparse.Namespace) -> int:
    i_configs, i_overrides = split_args(args.config)
    m_configs, m_overrides = split_args(args.metrics_config)

    plans = []  # made once by validate(), before a server starts, and handed to the flow

    def validate():
        from espnet3_prefect.checkpoints.evaluation import plan_evaluation

        plans.append(
            plan_evaluation(i_configs, m_configs, i_overrides, m_overrides, args.checkpoint, args.checkpoint_key)
        )

    def run():
        from espnet3_prefect.flows.evaluate import evaluate

        return evaluate(
            infer_config=i_configs,
            metrics_config=m_configs,
            infer_overrides=i_overrides,
            metrics_overrides=m_overrides,
            checkpoint=args.checkpoint,
            checkpoint_key=args.checkpoint_key,
            plan=plans[0],
        )

    def show(record):
        if record.get("already_scored"):
            print(f"already scored at {record['run_time']} (nothing decoded):")
        print(record["status"])
        for label, per_test in record["headline"].items():
            for test_set, value in per_test.items():
                print(f"{test_set}: {label} {value}")
        print(f"history: {Path(record['inference_dir']) / 'evaluate_history.jsonl'}")

    return run_stage(args, validate=validate, run=run, show=show)
