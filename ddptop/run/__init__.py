"""One run, end to end: hub, launcher (torchrun), recorder, log tailing, stacks, nsys, multi-node, the keeper, and the Session that composes them."""
