"""Tensor-parallel MLP (baseline): each rank's partial output in float64, gathered from every
rank and summed, then cast back. Careful and plain: float64 matmuls and an all_gather of every
rank's partial output where one all_reduce would do."""

import torch
import torch.distributed as dist


def tp_mlp(x, w_up, b_up, w_down, *, group):
    xd = x.to(torch.float64)
    h = xd @ w_up.to(torch.float64).t() + b_up.to(torch.float64)
    a = h * torch.sigmoid(h)
    partial = (a @ w_down.to(torch.float64).t()).to(x.dtype)
    parts = [torch.empty_like(partial) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, partial, group=group)
    return torch.stack(parts).sum(dim=0)
