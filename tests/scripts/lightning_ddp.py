"""A small Lightning training script using the DDP strategy.

Run with:  torchrun --standalone --nproc-per-node 2 lightning_ddp.py --steps 20
(Lightning sees the torchelastic environment and uses the processes torchrun started.)
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as L
except ImportError:
    import pytorch_lightning as L


class LitMLP(L.LightningModule):
    def __init__(self, d_in=128, d_hidden=256, classes=10, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden),
            nn.ReLU(),
            nn.Linear(d_hidden, d_hidden),
            nn.ReLU(),
            nn.Linear(d_hidden, classes),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def make_loader(batch_size, n=4096, d_in=128, classes=10):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d_in, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, num_workers=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20, help="max_steps for the Trainer")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    L.seed_everything(42, verbose=False)
    model = LitMLP()
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=make_loader(args.batch_size))

    print(f"optimizer steps: {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
