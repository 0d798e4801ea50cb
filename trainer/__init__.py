"""The workload each rank runs under torchrun: the article's ViT training with a
RunConfig applied to DDP, timed per phase and reported through ddptop's probe."""
