"""Train a GPT-style decoder-only transformer on random tokens, and time it.

A self-contained training script in the spirit of nanoGPT's train.py (written from scratch):
token + position embeddings, pre-LayerNorm blocks with causal self-attention through
F.scaled_dot_product_attention and a GELU MLP, a weight-tied lm_head, AdamW, a hand-set
cosine learning-rate schedule with linear warmup, gradient clipping, gradient accumulation
(DDP's all-reduce only on the last micro-batch, through require_backward_grad_sync), bf16
autocast and fused AdamW on CUDA, and optional torch.compile. As nanoGPT does by default, rank 0
reads the loss with loss.item() every iteration (--no-item-every-step: never), and batches are
random windows of a uint16 token file read through np.memmap (--data memmap; without
--data-file, ~10M random tokens are written once to the temp directory), pinned and copied
with non_blocking on CUDA, the next one fetched while the GPU runs the forward.

    python bench/gpt_train.py                                  # one process
    torchrun --standalone --nproc-per-node 8 bench/gpt_train.py --compile --out r.json

Under torchrun (RANK set) it trains with DistributedDataParallel, also with one rank. The
timing syncs the device only at the end of the warmup and at the end of the run; inside the
timed loop only the per-iteration loss.item() on rank 0 (and --log-interval) waits on the GPU.
Rank 0 ends with one line
    OWN_TIMING {"steps": <timed steps>, "ms_per_step": <wall ms>, "samples_per_step": <all ranks>}
"""

import argparse
import contextlib
import json
import math
import os
import socket
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# ---------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        assert n_embd % n_head == 0
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self):
        # the position embedding is not counted, as GPT-2 papers do; lm_head is tied to wte
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()

    def forward(self, idx, targets=None):
        B, T = idx.shape
        assert T <= self.block_size, f"sequence of {T} > block size {self.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizer(self, lr, weight_decay, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]  # matmuls and embeddings
        no_decay = [p for p in params if p.dim() < 2]  # biases and LayerNorm gains
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        extra = {"fused": True} if device_type == "cuda" else {}
        return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)


# ---------------------------------------------------------------------------- training


def parse_args():
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=10,
                   help="steps before the timed window starts")
    p.add_argument("--batch-size", type=int, default=8, help="micro-batch size per rank")
    p.add_argument("--block", type=int, default=1024 if cuda else 64, help="context length")
    p.add_argument("--n-layer", type=int, default=12 if cuda else 2)
    p.add_argument("--n-head", type=int, default=12 if cuda else 2)
    p.add_argument("--n-embd", type=int, default=768 if cuda else 64)
    p.add_argument("--vocab", type=int, default=50304 if cuda else 512)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=6e-5)
    p.add_argument("--lr-warmup", type=int, default=None,
                   help="linear LR warmup steps (default: 10%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--autocast", choices=["auto", "bf16", "none"], default="auto",
                   help="auto: bf16 on CUDA, none on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--item-every-step", action=argparse.BooleanOptionalAction, default=True,
                   help="rank 0 reads the loss with loss.item() every iteration, as nanoGPT "
                        "does (a device sync; prints nothing)")
    p.add_argument("--data", choices=["memmap", "random"], default="memmap",
                   help="memmap: random windows of a uint16 token file (nanoGPT's get_batch); "
                        "random: random tokens drawn on the device")
    p.add_argument("--data-file", default=None,
                   help="uint16 token file for --data memmap (default: ~10M random tokens "
                        "written once to the temp directory)")
    p.add_argument("--data-tokens", type=int, default=10_000_000,
                   help="tokens in the generated token file")
    p.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=None,
                   help="train with DDP (default: when launched by torchrun, i.e. RANK is set)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank's batches take --slow-data-ms longer")
    p.add_argument("--slow-data-ms", type=float, default=0.0)
    p.add_argument("--slow-matmuls", type=int, default=0,
                   help="this many extra square matmuls in --slow-rank's forward (its device is slower)")
    p.add_argument("--slow-matmul-size", type=int, default=4096, help="their side")
    p.add_argument("--slow-pause", default=None, metavar="A:B",
                   help="the slowness is off for timed steps A..B-1 (0: the first after --warmup): the "
                        "same run's steps with and without it give the job's loss to it (printed as "
                        "`slow steps median X ms, paused Y ms`, with each block's median)")
    p.add_argument("--log-interval", type=int, default=0,
                   help="print the loss every N steps (syncs the device; 0: never)")
    p.add_argument("--out", default=None, help="write the timing as JSON here (rank 0)")
    p.add_argument("--profile", default=None, metavar="START:COUNT",
                   help="torch.profiler over steps START..START+COUNT-1, without ddptop: each rank "
                        "writes rank<R>.trace.json.gz to --profile-dir (a plain run's trace)")
    p.add_argument("--profile-dir", default="gpt-traces")
    p.add_argument("--cpus-per-rank", type=int, default=0,
                   help="pin this process to its own CPUs (local rank k: the k-th block of this many of "
                        "the CPUs it may use), so that the ranks' hosts do not share cores (0: not pinned)")
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must be larger than --warmup ({args.warmup})")
    if args.slow_pause is not None:
        a, _, b = args.slow_pause.partition(":")
        if not (a.isdigit() and b.isdigit() and int(a) < int(b) <= args.steps - args.warmup):
            p.error(f"--slow-pause {args.slow_pause!r}: want A:B with A < B <= steps - warmup")
        args.slow_pause = (int(a), int(b))
    if args.lr_warmup is None:
        args.lr_warmup = max(1, args.steps // 10)
    if args.vocab > 65536 and args.data == "memmap":
        p.error("--data memmap stores uint16 tokens: --vocab must be <= 65536")
    return args


class Window:
    """A torch.profiler window of a few steps (CPU and CUDA activities), written per rank."""

    def __init__(self, spec, out_dir, rank):
        start, count = (int(x) for x in spec.split(":"))
        self.start, self.stop, self.rank, self.out_dir = start, start + count, rank, out_dir
        self.prof = None

    def at(self, step):
        from torch.profiler import ProfilerActivity, profile

        if step == self.start:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            # a schedule, so that step() marks ProfilerStep#N (HTA splits iterations on them)
            sched = torch.profiler.schedule(wait=0, warmup=0, active=self.stop - self.start, repeat=1)
            self.prof = profile(activities=acts, schedule=sched)
            self.prof.__enter__()
        if step == self.stop and self.prof is not None:
            self.prof.__exit__(None, None, None)
            os.makedirs(self.out_dir, exist_ok=True)
            self.prof.export_chrome_trace(os.path.join(self.out_dir, f"rank{self.rank}.trace.json.gz"))
            self.prof = None
        elif self.prof is not None and step > self.start:
            self.prof.step()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_distributed(args):
    """Returns (ddp, rank, local_rank, world_size, device)."""
    ddp = args.ddp if args.ddp is not None else "RANK" in os.environ
    if ddp and "RANK" not in os.environ:
        # --ddp without a launcher: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if ddp:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    else:
        # independent processes (e.g. --no-ddp under torchrun): only RANK 0 reports
        rank, world_size = int(os.environ.get("RANK", "0")), 1
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return ddp, rank, local_rank, world_size, device


def barrier():
    # on NCCL, naming the device keeps barrier() from guessing it (and warning)
    if torch.cuda.is_available():
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def token_file(args, ddp):
    """The uint16 token file to read: --data-file, or one of random tokens in the temp
    directory, written by each node's local rank 0 (atomically; kept and reused by later runs
    with the same size, vocabulary and seed) while the other ranks wait at a barrier."""
    if args.data_file:
        return args.data_file
    path = os.path.join(tempfile.gettempdir(), f"gpt_train_tokens_uid{os.getuid()}_"
                        f"v{args.vocab}_n{args.data_tokens}_s{args.seed}.bin")
    expected = 2 * args.data_tokens
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    writer = local_rank == 0 or not ddp  # without DDP there is no barrier: all may write
    if writer and not (os.path.exists(path) and os.path.getsize(path) == expected):
        rng = np.random.default_rng(args.seed)
        tokens = rng.integers(0, args.vocab, size=args.data_tokens, dtype=np.uint16)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                tokens.tofile(f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    if ddp:
        barrier()
    return path


def get_lr(step, args):
    if step < args.lr_warmup:
        return args.lr * (step + 1) / args.lr_warmup
    progress = (step - args.lr_warmup) / max(1, args.steps - args.lr_warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return args.min_lr + coeff * (args.lr - args.min_lr)


def pin(cpus_per_rank: int) -> None:
    """Each local rank on its own block of CPUs (the bench's symmetric runs differed by 4 ms a
    step when one rank's host ran late; issue 44). Too few CPUs: left unpinned."""
    if cpus_per_rank <= 0 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    k = int(os.environ.get("LOCAL_RANK", "0"))
    block = cpus[k * cpus_per_rank:(k + 1) * cpus_per_rank]
    if len(block) == cpus_per_rank:
        os.sched_setaffinity(0, block)


WINDOW = 50  # the straggler rule's window (ddptop.model.straggler.WINDOW): its last finding's steps


def paused_words(step_ms, start, stop):
    """The same run's steps with the slowness on and paused (--slow-pause START:STOP), and each
    block's median: blocks that disagree say the run drifted (its loss is then unresolved); and
    the median of the last WINDOW steps, those of the run verdict's last finding."""
    blocks = [b for b in (step_ms[:start], step_ms[start:stop], step_ms[stop:]) if b]
    slow = step_ms[:start] + step_ms[stop:]
    return (f"slow steps median {statistics.median(slow):.2f} ms, paused "
            f"{statistics.median(step_ms[start:stop]):.2f} ms; blocks "
            + ", ".join(f"{statistics.median(b):.2f}" for b in blocks)
            + f"; last {WINDOW} steps median {statistics.median(step_ms[-WINDOW:]):.2f} ms")


def main():
    args = parse_args()
    pin(args.cpus_per_rank)
    ddp, rank, local_rank, world_size, device = setup_distributed(args)
    master = rank == 0
    device_type = device.type

    torch.manual_seed(args.seed)  # same init everywhere (DDP broadcasts rank 0's anyway)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    use_bf16 = args.autocast == "bf16" or (args.autocast == "auto" and device_type == "cuda")
    autocast = (torch.autocast(device_type, dtype=torch.bfloat16) if use_bf16
                else contextlib.nullcontext())

    model = GPT(args.vocab, args.block, args.n_layer, args.n_head, args.n_embd).to(device)
    if master:
        print(f"gpt_train: {model.num_params() / 1e6:.2f}M parameters, world {world_size}, "
              f"device {device_type}, ddp {ddp}, compile {args.compile}, "
              f"bf16 {use_bf16}, batch {args.batch_size}x{args.accum}x{args.block}, "
              f"data {args.data}, item every step {args.item_every_step}", flush=True)
    optimizer = model.configure_optimizer(args.lr, args.weight_decay, (0.9, 0.95), device_type)
    if args.compile:
        model = torch.compile(model)
    slow_now = [True]  # the injected slowness is on (off inside --slow-pause)
    if args.slow_rank == rank and args.slow_matmuls > 0:  # a straggler on purpose: more work in its forward
        side = args.slow_matmul_size
        extra = torch.randn(side, side, device=device) / side ** 0.5

        def more_work(module, inputs):  # inside the loop's autocast: bf16 matmuls on a GPU
            if not slow_now[0]:
                return
            with torch.no_grad():
                y = extra
                for _ in range(args.slow_matmuls):
                    y = y @ extra
        model.register_forward_pre_hook(more_work)
    if ddp:
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)

    if args.data == "memmap":
        data_path = token_file(args, ddp)
        # window offsets drawn on the CPU, a different stream per rank
        data_gen = torch.Generator().manual_seed(args.seed + 1000 * rank)

        def get_batch():
            # nanoGPT's get_batch: the memmap is opened anew for every batch (a long-lived
            # np.memmap keeps growing its resident pages)
            data = np.memmap(data_path, dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - args.block, (args.batch_size,), generator=data_gen)
            x = torch.stack([torch.from_numpy(data[i:i + args.block].astype(np.int64))
                             for i in ix.tolist()])
            y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + args.block].astype(np.int64))
                             for i in ix.tolist()])
            if device_type == "cuda":
                return (x.pin_memory().to(device, non_blocking=True),
                        y.pin_memory().to(device, non_blocking=True))
            return x, y
    else:
        # random tokens, drawn on the device, a different stream per rank
        data_gen = torch.Generator(device=device).manual_seed(args.seed + 1000 * rank)

        def get_batch():
            tok = torch.randint(0, args.vocab, (args.batch_size, args.block + 1), device=device,
                                generator=data_gen)
            return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    if args.slow_rank == rank and args.slow_data_ms > 0:  # a straggler on purpose: its loader is slow
        fetch = get_batch

        def get_batch():
            if slow_now[0]:
                time.sleep(args.slow_data_ms / 1000.0)
            return fetch()

    def sync():
        if device_type == "cuda":
            torch.cuda.synchronize(device)

    timed = args.steps - args.warmup
    if device_type == "cuda":
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(timed + 1)]
    else:
        marks = [0.0] * (timed + 1)

    def mark(i):
        if device_type == "cuda":
            marks[i].record()
        else:
            marks[i] = time.perf_counter()

    profile = Window(args.profile, args.profile_dir, rank) if args.profile else None
    model.train()
    t0 = None
    loss = None
    x, y = get_batch()  # the first batch; each later one is fetched during a forward
    for step in range(args.steps):
        if step == args.warmup:
            sync()
            t0 = time.perf_counter()
        if step >= args.warmup:
            mark(step - args.warmup)
        if profile is not None:
            profile.at(step)
        if args.slow_pause is not None:
            slow_now[0] = not args.slow_pause[0] <= step - args.warmup < args.slow_pause[1]

        lr = get_lr(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr

        for micro in range(args.accum):
            if ddp:
                # all-reduce the gradients only on the last micro-step
                model.require_backward_grad_sync = micro == args.accum - 1
            with autocast:
                _, loss = model(x, y)
                loss = loss / args.accum
            # the next batch while the GPU runs this forward (nanoGPT's prefetch)
            x, y = get_batch()
            loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if args.item_every_step and master:
            # nanoGPT reads the loss every iteration (log_interval 1): a device sync on rank 0
            _lossf = loss.item() * args.accum  # read, not printed

        if args.log_interval and master and (step + 1) % args.log_interval == 0:
            print(f"step {step + 1}: loss {loss.item() * args.accum:.4f} lr {lr:.2e}",
                  flush=True)

    mark(timed)
    sync()
    elapsed = time.perf_counter() - t0

    if device_type == "cuda":
        step_ms = [marks[i].elapsed_time(marks[i + 1]) for i in range(timed)]
    else:
        step_ms = [1000.0 * (marks[i + 1] - marks[i]) for i in range(timed)]
    steps_per_s = timed / elapsed
    result = {
        "steps_per_s": steps_per_s,
        "steps": timed,
        "step_ms_median": statistics.median(step_ms),
        "warmup": args.warmup,
        "total_steps": args.steps,
        "tokens_per_s": steps_per_s * args.batch_size * args.accum * args.block * world_size,
        "world_size": world_size,
        "device": device_type,
        "compile": args.compile,
        "data": args.data,
        "item_every_step": args.item_every_step,
        "final_loss": loss.item() * args.accum,
    }
    samples_per_step = args.batch_size * args.accum * world_size
    if master and args.slow_pause is not None:
        print(f"gpt_train: {paused_words(step_ms, *args.slow_pause)}", flush=True)
    if master:
        print(f"gpt_train: final loss {result['final_loss']:.4f}, "
              f"step median {result['step_ms_median']:.2f} ms, "
              f"{result['tokens_per_s']:.0f} tokens/s", flush=True)
        print(f"gpt_train: steps/s {steps_per_s:.3f} over the last {timed} steps", flush=True)
        own = {"steps": timed, "ms_per_step": round(1000.0 * elapsed / timed, 3),
               "samples_per_step": samples_per_step}
        print(f"OWN_TIMING {json.dumps(own)}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")

    if ddp:
        barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
