"""Synthetic data as in the article: random images and labels behind a
DistributedSampler and DataLoader workers (pinned memory on GPU)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

POOL = 64  # distinct random images; generating fresh ones per item would measure torch.randn


class SyntheticImages(Dataset):
    def __init__(self, length: int, image_size: int, num_classes: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randn(POOL, 3, image_size, image_size, generator=gen)
        self.labels = torch.randint(0, num_classes, (length,), generator=gen)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index % POOL], self.labels[index]


def batches(
    dataset: Dataset, batch_size: int, workers: int, distributed: bool, pin: bool, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches, one epoch after another, as a training loop sees them."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed) if distributed else None
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, shuffle=sampler is None,
        num_workers=workers, pin_memory=pin, drop_last=True,
        persistent_workers=workers > 0,
    )
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def device_batches(
    batch_size: int, image_size: int, num_classes: int, device: torch.device, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Random batches generated on the device each step (the reference recipe's way)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    while True:
        yield (torch.randn(batch_size, 3, image_size, image_size, device=device, generator=gen),
               torch.randint(0, num_classes, (batch_size,), device=device, generator=gen))
