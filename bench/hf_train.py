"""Train GPT-2 with the Hugging Face Trainer on random tokens, and time it.

A plain `transformers.Trainer` script as a user would write it: a GPT2LMHeadModel built from a
GPT2Config (no download: GPT-2 small's shape on CUDA, a tiny one on the CPU), an in-memory
torch Dataset of random token ids (labels = input_ids), TrainingArguments with bf16 on CUDA,
gradient accumulation 2 (Accelerate's no_sync on the first micro-batch), max_steps, no saving,
no logging integrations. Nothing here touches the network (HF_HUB_OFFLINE=1).

    python bench/hf_train.py --steps 30                                       # one process
    torchrun --standalone --nproc-per-node 2 bench/hf_train.py --steps 100    # DDP

A TrainerCallback times the optimizer steps after the first --warmup (5): the device is synced
at the end of step 5 and at the end of the last step. Rank 0 ends with one line
    OWN_TIMING {"steps": <timed steps>, "ms_per_step": <wall ms>, "samples_per_step": <all ranks>}
"""

import os

# before transformers is imported: it reads these once
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class RandomTokens(Dataset):
    """`n` sequences of `block` random token ids, held in memory; labels = input_ids (the
    model shifts them)."""

    def __init__(self, n, block, vocab, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, block), generator=g)

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        return {"input_ids": ids, "labels": ids.clone()}


class StepTimer(TrainerCallback):
    """Wall time from the end of optimizer step `warmup` to the end of the last one, the
    device synced at those two points only."""

    def __init__(self, warmup, cuda):
        self.warmup, self.cuda = warmup, cuda
        self.t0 = self.t1 = self.last = None

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    # end to end rather than on_step_begin to on_step_end: the interval then holds the
    # fetching of each timed step's batches, which the Trainer does before on_step_begin
    def on_step_end(self, args, state, control, **kwargs):
        # global_step counts optimizer steps (one per gradient_accumulation_steps micro-batches)
        if state.global_step == self.warmup:
            self._sync()
            self.t0 = time.perf_counter()
        elif self.t0 is not None and state.global_step == state.max_steps:
            self._sync()
            self.t1, self.last = time.perf_counter(), state.global_step


def main():
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50, help="optimizer steps (max_steps)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--batch-size", type=int, default=8 if cuda else 4,
                   help="per_device_train_batch_size")
    p.add_argument("--accum", type=int, default=2, help="gradient_accumulation_steps")
    p.add_argument("--block", type=int, default=512 if cuda else 64, help="sequence length")
    p.add_argument("--samples", type=int, default=4096,
                   help="sequences in the dataset (the Trainer runs as many epochs as it needs)")
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must be larger than --warmup ({args.warmup})")

    if cuda:  # GPT-2 small (124M), built from its config: no download
        config = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    else:
        config = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                            bos_token_id=511, eos_token_id=511)
    if args.block > config.n_positions:
        p.error(f"--block ({args.block}) is longer than n_positions ({config.n_positions})")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    dataset = RandomTokens(args.samples, args.block, config.vocab_size)

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    timer = StepTimer(args.warmup, cuda)
    with tempfile.TemporaryDirectory(prefix="hf_train_") as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.accum,
            max_steps=args.steps,
            learning_rate=3e-4,
            bf16=cuda,
            use_cpu=not cuda,
            # only under a launcher: with it set, Accelerate assumes a process group
            ddp_backend=("nccl" if cuda else "gloo") if "RANK" in os.environ else None,
            dataloader_num_workers=0,
            logging_steps=1_000_000,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset,
                          callbacks=[timer])
        trainer.train()
        rank0 = trainer.is_world_process_zero()

    if rank0:
        if timer.t1 is None:
            print(f"hf_train: no timing (the run ended before step {args.steps})", flush=True)
            return
        timed = timer.last - args.warmup
        ms = 1000.0 * (timer.t1 - timer.t0) / timed
        samples = args.batch_size * args.accum * world_size
        print(f"hf_train: {sum(t.numel() for t in model.parameters()) / 1e6:.2f}M parameters, "
              f"world {world_size}, {'cuda bf16' if cuda else 'cpu'}, batch "
              f"{args.batch_size}x{args.accum}x{args.block}, {ms:.2f} ms/step, "
              f"{samples * 1000.0 / ms:.1f} samples/s", flush=True)
        own = {"steps": timed, "ms_per_step": round(ms, 3), "samples_per_step": samples}
        print(f"OWN_TIMING {json.dumps(own)}", flush=True)


if __name__ == "__main__":
    main()
