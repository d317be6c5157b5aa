"""RMSNorm over the last axis (baseline): computed in float64 for accuracy, then cast back."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.to(torch.float64)
    rms = torch.sqrt(torch.mean(xd * xd, dim=-1, keepdim=True) + eps)
    return (xd / rms * weight.to(torch.float64)).to(x.dtype)
