"""Default hyper-parameters; values are FBGEMM TBE's constructor defaults (fbgemm_gpu 1.8)."""

from typing import Dict

ADAGRAD_DEFAULTS: Dict[str, float] = {"eps": 1e-8}
ADAM_DEFAULTS: Dict[str, float] = {"beta1": 0.9, "beta2": 0.999}
