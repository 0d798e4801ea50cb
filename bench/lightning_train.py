"""Train a small transformer encoder with PyTorch Lightning's DDP strategy, and time it.

A plain Lightning script as a user would write it: a LightningModule (token embedding, a
pre-LayerNorm nn.TransformerEncoder, a linear head predicting each position's next token on
random data), AdamW, a DataLoader that Lightning gives a DistributedSampler, and
`Trainer(strategy="ddp", precision="bf16-mixed" on CUDA, max_steps=--steps)`. On CUDA the model
is 6 layers of width 1024 on batches of [32, 256] tokens per rank (a step of a few tens of ms on
an H100); on the CPU a tiny one.

    torchrun --standalone --nproc-per-node 2 bench/lightning_train.py --steps 100

Under torchrun, Lightning sees the torchelastic environment (TorchElasticEnvironment) and uses
the processes torchrun started; `devices` is torchrun's LOCAL_WORLD_SIZE. A Callback times the
optimizer steps after the first --warmup (5): the device is synced at the end of step 5 and at
the end of the last step. Rank 0 ends with one line
    OWN_TIMING {"steps": <timed steps>, "ms_per_step": <wall ms>, "samples_per_step": <all ranks>}
"""

import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

try:
    import lightning.pytorch as L
except ImportError:
    import pytorch_lightning as L


class RandomSequences(Dataset):
    """`n` sequences of `seq + 1` random token ids, held in memory."""

    def __init__(self, n, seq, vocab, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (n, seq + 1), generator=g)

    def __len__(self):
        return self.tokens.shape[0]

    def __getitem__(self, i):
        return self.tokens[i]


class LitEncoder(L.LightningModule):
    def __init__(self, vocab, seq, d_model, n_layer, n_head, lr=3e-4):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_head, dim_feedforward=4 * d_model,
                                           dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[:, :ids.shape[1]]
        return self.head(self.norm(self.encoder(x)))

    def training_step(self, batch, batch_idx):
        ids, target = batch[:, :-1], batch[:, 1:]
        logits = self(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


class StepTimer(L.Callback):
    """Wall time from the end of optimizer step `warmup` to the end of the last one, the
    device synced at those two points only."""

    def __init__(self, warmup, cuda):
        self.warmup, self.cuda = warmup, cuda
        self.t0 = self.t1 = self.last = None

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    # end to end rather than on_train_batch_start to on_train_batch_end: the interval then
    # holds the fetching of each timed step's batch, which Lightning does before the start hook
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # global_step counts optimizer steps
        if trainer.global_step == self.warmup and self.t0 is None:
            self._sync()
            self.t0 = time.perf_counter()
        elif self.t0 is not None and trainer.global_step == trainer.max_steps:
            self._sync()
            self.t1, self.last = time.perf_counter(), trainer.global_step


def main():
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50, help="optimizer steps (max_steps)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--batch-size", type=int, default=32 if cuda else 8, help="per rank")
    p.add_argument("--seq", type=int, default=256 if cuda else 32, help="tokens per sequence")
    p.add_argument("--d-model", type=int, default=1024 if cuda else 64)
    p.add_argument("--n-layer", type=int, default=6 if cuda else 2)
    p.add_argument("--n-head", type=int, default=16 if cuda else 2)
    p.add_argument("--vocab", type=int, default=8192 if cuda else 256)
    p.add_argument("--samples", type=int, default=4096,
                   help="sequences in the dataset (the Trainer runs as many epochs as it needs)")
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must be larger than --warmup ({args.warmup})")

    L.seed_everything(0, verbose=False)
    if cuda:
        torch.set_float32_matmul_precision("high")
    model = LitEncoder(args.vocab, args.seq, args.d_model, args.n_layer, args.n_head)
    loader = DataLoader(RandomSequences(args.samples, args.seq, args.vocab),
                        batch_size=args.batch_size, shuffle=True, num_workers=0,
                        pin_memory=cuda, drop_last=True)
    timer = StepTimer(args.warmup, cuda)
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        strategy="ddp",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        precision="bf16-mixed" if cuda else "32-true",
        max_steps=args.steps,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(model, train_dataloaders=loader)

    if trainer.global_rank == 0:
        if timer.t1 is None:
            print(f"lightning_train: no timing (the run ended before step {args.steps})",
                  flush=True)
            return
        timed = timer.last - args.warmup
        ms = 1000.0 * (timer.t1 - timer.t0) / timed
        samples = args.batch_size * trainer.world_size
        params = sum(t.numel() for t in model.parameters())
        print(f"lightning_train: {params / 1e6:.2f}M parameters, world {trainer.world_size}, "
              f"{'cuda bf16-mixed' if cuda else 'cpu'}, batch {args.batch_size}x{args.seq}, "
              f"{ms:.2f} ms/step, {samples * 1000.0 / ms:.1f} samples/s", flush=True)
        own = {"steps": timed, "ms_per_step": round(ms, 3), "samples_per_step": samples}
        print(f"OWN_TIMING {json.dumps(own)}", flush=True)


if __name__ == "__main__":
    main()
