"""The Pre-Norm / Post-Norm lab: small, fast experiments behind the app's "Pre vs Post-Norm lab" view.

Three variants of the same decoder, built from `LlamaModel` at a small width: Pre-Norm (LLaMA), Post-Norm (the
2017 Transformer) and DeepNorm (Wang et al. 2022); variants.py states each one's formula and constants.

Modules: variants.py (the three models), probe.py (gradients at initialization), race.py (the training
race and its shipped curves), twins.py (the trained twins' recordings and logs).

Experiments (deterministic for a given seed and thread count). They never set torch's thread count, which
is process-wide: the app runs them in its one lab worker process (lab/worker.py), which uses one thread;
offline runs (`python -m explorer_model.lab.normlab`) use `threads(1)` around the whole job.
  - `init_gradients`: at initialization, the gradient norm of every layer's FFN output weight
    (mlp.down_proj), the residual RMS per layer, and how far the output moves after one Adam step,
    for depths 2…48 (Xiong et al. 2020, Fig. 3; Liu et al. 2020's amplification).
  - `race`: Pre and Post, each with and without learning-rate warmup, trained side by side on the
    shipped corpus; `precompute_race_curves` ships three seeds of it in assets/lab/race_curves.json.

Training data for the gradient probe are random tokens drawn with Zipf-law frequencies (like words in
text), so the probe needs neither the corpus nor a tokenizer and takes a few seconds.
"""
from __future__ import annotations

# The lab lives in four modules by concept; this one gathers them under one import path.
from ..paths import ASSETS  # noqa: F401
from .probe import (SWEEP_DEPTHS, init_gradients, last_first_ratio, lm_loss, probe,  # noqa: F401
                    profile_ratio, zipf_tokens)
from .race import (PLATEAU_MARGIN, RACE_CURVES_PATH, RACE_GRID, RACE_RUNS, RUN_KEYS, RaceConfig, escape_step,  # noqa: F401
                   load_race_curves, precompute_race_curves, race, race_data, race_grid_key, run_key)
from .twins import (TWINS, log_curves, norm_scales, residual_norms, sequence_loss, top_predictions,  # noqa: F401
                    train_log)
from .variants import (DEPTHS, VARIANTS, LabOptions, deepnorm_alpha, deepnorm_beta, deepnorm_residual,  # noqa: F401
                       init_weights, lab_config, threads, variant_model)

if __name__ == "__main__":  # python -m explorer_model.lab.normlab: rebuild assets/lab/race_curves.json
    with threads(1):  # its own process: the thread count concerns nobody else
        precompute_race_curves()
