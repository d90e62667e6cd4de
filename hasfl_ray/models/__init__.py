"""Models of the paper, built at any width p, with the slice descriptions that drive sub-model training."""

from __future__ import annotations

from typing import Dict, List

from torch import nn

from hasfl_ray.models.cnn import ImageCNN
from hasfl_ray.models.lstm import CharLSTM
from hasfl_ray.models.mlp import MLP
from hasfl_ray.models.slicing import (DimSlice, ParamSpec, extract, extract_state, gate_blocks_of, insert_, mask,
                                      region, width_channels)

PAPER_STAGES = ((64, 64), (128, 128), (256, 256))

#: Architecture of the model each dataset trains (DESIGN.md, "Models").
MODEL_CONFIGS: Dict[str, dict] = {
    "cifar10": dict(kind="cnn", in_channels=3, num_classes=10, image_size=32, stages=PAPER_STAGES, fc_width=512),
    "emnist": dict(kind="cnn", in_channels=1, num_classes=62, image_size=28, stages=PAPER_STAGES, fc_width=512),
    "digits": dict(kind="cnn", in_channels=1, num_classes=10, image_size=8, stages=((32,), (64,)), fc_width=128),
    "shakespeare": dict(kind="lstm", vocab_size=95, embed_dim=8, hidden=256, layers=2, seq_len=80),
    "synthetic": dict(kind="mlp", in_features=60, num_classes=10, hidden=(128, 128)),
}

MODEL_NAMES = tuple(MODEL_CONFIGS)


def build_model(name: str, width: float = 1.0) -> nn.Module:
    """The model of dataset ``name`` as a physically width-``width`` network."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"model {name!r} is unknown; expected one of {', '.join(MODEL_NAMES)}")
    config = dict(MODEL_CONFIGS[name])
    kind = config.pop("kind")
    cls = {"cnn": ImageCNN, "lstm": CharLSTM, "mlp": MLP}[kind]
    return cls(width=width, **config)


def cost_table(name: str, widths=(0.25, 0.5, 0.75, 1.0)) -> List[dict]:
    """Params, MACs per sample and fp32 upload MB of model ``name`` at each width (the paper's Table 2)."""
    model = build_model(name)
    specs = model.param_specs()
    rows = []
    for p in widths:
        params = sum(spec.numel(p) for spec in specs.values())
        rows.append({"p": p, "params": params, "macs": model.macs(p), "upload_mb": params * 4 / 1e6})
    return rows


__all__ = ["CharLSTM", "DimSlice", "ImageCNN", "MLP", "MODEL_CONFIGS", "MODEL_NAMES", "ParamSpec", "build_model",
           "cost_table", "extract", "extract_state", "gate_blocks_of", "insert_", "mask", "region",
           "width_channels"]
