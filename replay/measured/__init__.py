"""Real vLLM experiments as a validation set: load them (experiments.py), rebuild each one's
workload (workload.py) and fleet (fleet.py), replay and measure it as the harness did (run.py),
and compare with what the client measured (compare.py)."""

from replay.measured.experiments import WHOLE_RUN, Experiment, Stage, load_experiments
from replay.measured.fleet import POOL, apply_overrides, experiment_config, experiment_fleet
from replay.measured.run import ExperimentReplay, replay_experiment
from replay.measured.workload import STAGE_GAP_S, experiment_trace

__all__ = [
    "POOL", "STAGE_GAP_S", "WHOLE_RUN", "Experiment", "ExperimentReplay", "Stage", "apply_overrides",
    "experiment_config", "experiment_fleet", "experiment_trace", "load_experiments", "replay_experiment",
]
