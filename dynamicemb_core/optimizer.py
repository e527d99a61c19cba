"""Compatibility module: ``dynamicemb.optimizer``'s public names, for ported code.

``EmbOptimType`` is FBGEMM's enum (the one TorchRec's ``fused_params`` take); ``OptimizerArgs`` holds the
fused optimizer's hyper-parameters (:mod:`dynamicemb_core.optim`).
"""

from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.optim.args import OptimizerArgs

__all__ = ["EmbOptimType", "OptimizerArgs"]
