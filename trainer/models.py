"""Models: the article's ViT-L/32 (and its smaller siblings) and a tiny ViT for CPUs."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    image_size: int
    num_classes: int


SPECS = {
    "vit_l_32": ModelSpec("vit_l_32", 224, 1000),
    "vit_b_32": ModelSpec("vit_b_32", 224, 1000),
    "vit_b_16": ModelSpec("vit_b_16", 224, 1000),
    "tiny_vit": ModelSpec("tiny_vit", 32, 10),
}


def resolve_model(name: str, cuda: bool) -> ModelSpec:
    if name == "auto":
        name = "vit_l_32" if cuda else "tiny_vit"
    return SPECS[name]


def build_model(spec: ModelSpec) -> nn.Module:
    from torchvision import models

    if spec.name == "tiny_vit":
        # Same architecture family as ViT-L/32, sized to step in milliseconds on a CPU.
        return models.VisionTransformer(
            image_size=spec.image_size, patch_size=8, num_layers=2, num_heads=4,
            hidden_dim=64, mlp_dim=128, num_classes=spec.num_classes,
        )
    return getattr(models, spec.name)(weights=None)
