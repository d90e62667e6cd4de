"""The paper's Shakespeare model: Embedding(95, 8) -> 2-layer LSTM(256) -> FC(256 -> 95), at any width p."""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from hasfl_ray.models.slicing import DimSlice, ParamSpec, width_channels


class CharLSTM(nn.Module):
    """Next-character LSTM whose width slices the leading hidden units inside each of the 4 gate blocks.

    The embedding and the output bias are shared in full by every width; the output weight loses
    its sliced input columns. ``forward`` maps (batch, seq) int64 to (batch, vocab) logits of the
    character after the sequence.
    """

    #: Zero-padded hidden units (zero rows in every gate block, zero columns) keep c = h = 0 at every step
    #: (:func:`hasfl_ray.models.pads_exactly`).
    pads_exactly = True

    def __init__(self, vocab_size: int = 95, embed_dim: int = 8, hidden: int = 256, layers: int = 2,
                 seq_len: int = 80, width: float = 1.0):
        super().__init__()
        self.vocab_size, self.embed_dim, self.hidden, self.layers = vocab_size, embed_dim, hidden, layers
        self.seq_len, self.width = seq_len, width
        h = width_channels(width, hidden)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, h, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(h, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x))
        return self.fc(out[:, -1])

    def param_specs(self) -> Dict[str, ParamSpec]:
        """Slice descriptions of every trainable parameter, at full width."""
        H = self.hidden
        gates = DimSlice(4 * H, blocks=4)
        specs = {"embedding.weight": ParamSpec("embedding.weight", (DimSlice(self.vocab_size, False),
                                                                    DimSlice(self.embed_dim, False)))}
        for layer in range(self.layers):
            in_dim = DimSlice(self.embed_dim, False) if layer == 0 else DimSlice(H)
            for name, dims in ((f"lstm.weight_ih_l{layer}", (gates, in_dim)),
                               (f"lstm.weight_hh_l{layer}", (gates, DimSlice(H))),
                               (f"lstm.bias_ih_l{layer}", (gates,)),
                               (f"lstm.bias_hh_l{layer}", (gates,))):
                specs[name] = ParamSpec(name, dims)
        specs["fc.weight"] = ParamSpec("fc.weight", (DimSlice(self.vocab_size, False), DimSlice(H)))
        specs["fc.bias"] = ParamSpec("fc.bias", (DimSlice(self.vocab_size, False),))
        return specs

    def macs(self, p: float) -> int:
        """Multiply-accumulates per sample: the gate matrices over every step, then the output layer."""
        h = width_channels(p, self.hidden)
        per_step = sum(4 * h * ((self.embed_dim if layer == 0 else h) + h) for layer in range(self.layers))
        return per_step * self.seq_len + h * self.vocab_size
