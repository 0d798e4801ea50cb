"""The word-language-model loop of pytorch/examples (word_language_model/main.py) under DDP:
a corpus batchified to [N, B] columns, time-major [bptt, B] slices with no DataLoader, an LSTM
without batch_first, the hidden state carried over. B=--batch samples a step (the example's
update is hand-written; this DDP variant steps torch.optim.SGD).

Run with:  torchrun --standalone --nproc-per-node 2 word_lm.py [--steps N] [--batch B] [--bptt T]
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

NTOKEN = 200


class RNNModel(nn.Module):
    def __init__(self, ntoken=NTOKEN, ninp=32, nhid=32, nlayers=2):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.encoder(input), hidden)
        return torch.log_softmax(self.decoder(output).view(-1, NTOKEN), dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--bptt", type=int, default=35)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    train_data = batchify(torch.randint(0, NTOKEN, (args.steps * args.bptt * args.batch + 1,)), args.batch)
    model = DDP(RNNModel())
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    hidden = model.module.init_hidden(args.batch)
    steps = 0
    for i in range(0, train_data.size(0) - 1, args.bptt):
        data, targets = get_batch(train_data, i, args.bptt)
        if data.size(0) < args.bptt:
            break
        optimizer.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        steps += 1
    print(f"rank {dist.get_rank()}: {steps} steps of [bptt={args.bptt}, B={args.batch}]", flush=True)
    dist.barrier()  # leave together: gloo can abort in teardown when a peer is already gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
