"""A user's own DDP script, instrumented with ddptop's probe in three lines."""

import torch
import torch.distributed as dist
import torch.nn as nn

from ddptop.probe import Probe  # 1

dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
probe = Probe.connect(backend="gloo")  # 2
for _ in range(25):
    loss = model(torch.randn(16, 64)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if probe.tick(samples=16):  # 3
        break
# gloo can abort (SIGABRT) in destroy_process_group when a peer has already torn its pairs
# down (seen in CI after every step had completed): leave together, as careful scripts do
dist.barrier()
dist.destroy_process_group()
