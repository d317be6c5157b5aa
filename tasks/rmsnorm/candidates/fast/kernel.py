"""RMSNorm via a fused vector norm and in-place scaling; float32 math."""

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
    inv_rms = torch.rsqrt(norm.square_().div_(x.shape[-1]).add_(eps))
    return torch.mul(xf, inv_rms).mul_(weight.to(torch.float32)).to(x.dtype)
