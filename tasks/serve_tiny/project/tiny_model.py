"""The served model's compute (editable): vLLM's Llama with its MLP activation defined here.

The engine loads the architecture the binding names (`RsiTinyForCausalLM`); serve_bench.py
registers this class with vLLM through a general plugin before the server starts, in every
engine process. A candidate may replace the compute below (or the whole class); the
correctness check compares its greedy tokens with the reference engine's, token for token.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.models.llama import LlamaForCausalLM


class SiluAndMul(nn.Module):
    """silu(gate) * up over the last dimension, gate first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return nn.functional.silu(x[..., :d]) * x[..., d:]


class RsiTinyForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        for layer in self.model.layers:
            layer.mlp.act_fn = SiluAndMul()
