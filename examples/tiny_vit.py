"""A small Vision Transformer as a plug-in model (docs/plugins.md#models): ``--model examples/tiny_vit.py:TinyViT``.

Width p keeps ceil(p * heads) attention heads of ``head_dim`` each (so the embedding has ceil(p * heads) * head_dim
features) and ceil(p * hidden) units in every MLP; the patches, the head size and the classes never scale.
hasfl-ray derives the slicing from the shapes: the embedding dimension slices in whole heads (channels of
``head_dim`` positions), and the fused q/k/v projection, declared in ``slice_blocks``, in three blocks sliced alike.
"""

from __future__ import annotations

import torch
from torch import nn

from hasfl_ray.models import width_channels


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, heads: int, head_dim: int, hidden: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        dim = heads * head_dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)  # rows: all queries, then all keys, then all values
        self.proj = nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-2, -1) / self.head_dim ** 0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, n, dim))
        return x + self.fc2(torch.relu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    """Patch embedding (a conv of stride ``patch``), a class token, learned positions, ``depth`` blocks, a head."""

    #: The q/k/v projection's rows are three blocks, each sliced to its leading heads (hasfl-ray cannot tell three
    #: blocks from channels of three positions by shapes alone, so the model says so).
    slice_blocks = {"blocks.*.qkv.weight": 3, "blocks.*.qkv.bias": 3}

    def __init__(self, width: float = 1.0, in_channels: int = 3, image_size=32, num_classes: int = 10,
                 patch: int = 4, heads: int = 4, head_dim: int = 8, depth: int = 2, mlp_ratio: int = 2):
        super().__init__()
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        kept = width_channels(width, heads)
        dim, hidden = kept * head_dim, width_channels(width, mlp_ratio * heads * head_dim)
        tokens = (size[0] // patch) * (size[1] // patch)
        self.embed = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, tokens + 1, dim))
        self.blocks = nn.ModuleList(Block(kept, head_dim, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))
