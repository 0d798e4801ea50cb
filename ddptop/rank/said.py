"""What a rank tells the hub besides its steps: facts (each sent once, the script's own
words kept over what the instrument reads) and notes for the user. Neither goes to the
script's own output. Imports nothing of torch or the monitor."""

from __future__ import annotations

import sys
from typing import Any

MAX_NOTES = 16
NO_OPTIMIZER_AFTER = 50  # forwards with grad and no torch.optim step yet: say steps cannot be seen
HOW = "steps need a torch.optim optimizer, or Probe.tick() in the script's loop (from ddptop.probe import Probe)"
NO_OPTIMIZER = f"no torch.optim optimizer step after {NO_OPTIMIZER_AFTER} forwards: {HOW}"
RATES_DIFFER = ("optimizers step at different rates: a step is one step of those the first iteration stepped (a "
                "WGAN's critic, a student); the others' steps (its generator, a teacher) fall inside the step after them")
NO_OPTIMIZER_UPDATED = f"the model's parameters are updated without a torch.optim optimizer step: {HOW}"


class Said:
    def __init__(self, probe: Any, rank: int) -> None:
        self.probe = probe
        self.rank = rank
        self.facts_sent: dict[str, Any] = {}
        self.script_facts: dict[str, Any] = {}
        self.notes_sent: set[str] = set()
        self.forwards = 0  # with grad, before any optimizer step
        self.watched: Any = None  # the first trainable parameter a forward with grad ran with
        self.watched_module: int | None = None  # id of the module it belongs to
        self.version: int | None = None  # its version at that module's last forward
        self.first_values: Any = None  # a few of its values at that module's first forward
        self.told = False  # that no step can be seen

    def send_facts(self, facts: dict[str, Any], from_script: bool = False) -> None:
        """Send facts not sent yet; what the script said itself (Probe.connect(model=...))
        is not replaced by what the instrument reads."""
        if from_script:
            self.script_facts.update(facts)
        fresh = {k: v for k, v in facts.items()
                 if self.facts_sent.get(k) != v and (from_script or k not in self.script_facts)}
        if fresh:
            self.facts_sent.update(fresh)
            self.probe.info(fresh, [])

    def note(self, text: str) -> None:
        """A note for the run's notes and logs, through the hub: on the script's stderr only
        when the hub is gone (the script's output is the script's)."""
        if text in self.notes_sent or len(self.notes_sent) >= MAX_NOTES:
            return
        self.notes_sent.add(text)
        if self.probe.connected:
            self.probe.info({}, [text[:500]])
        elif not self.probe.forked:
            print(f"ddptop: rank {self.rank}: {text}", file=sys.stderr, flush=True)

    def forward_before_any_step(self, module: Any, stepped: bool) -> None:
        """A forward with grad; `stepped`: a torch.optim step (or the script's tick()) was seen.
        Before any, a loop with its own update (or none) makes no step ddptop can see: said at
        the next forward of the first module with a trainable parameter when that parameter
        changed in between (an in-place update, `p -= lr * p.grad`), else after a few dozen
        forwards, in plain words. Without DDP the outermost modules of a step include the
        loss (`criterion(model(x), y)`): a module with no parameter of its own, or another
        module than the watched one, tells nothing about the update."""
        if stepped or self.told:
            return
        self.forwards += 1
        param = next((p for p in module.parameters() if p.requires_grad), None)
        updated = False
        if param is not None and self.watched is None:  # the first module with one: watched from now on
            self.watched, self.watched_module = param, id(module)
            self.version = getattr(param, "_version", None)
            # `p.data.add_(...)` leaves the version as it was: a few of the values tell (read
            # once, at the watched module's next forward: one wait for the device, before any step)
            self.first_values = param.detach().flatten()[:8].clone()
        elif param is not None and id(module) == self.watched_module and self.watched is not None:
            version = getattr(self.watched, "_version", None)
            updated = self.version is not None and version != self.version
            self.version = version
            if self.first_values is not None:
                updated |= not self.first_values.equal(self.watched.detach().flatten()[:8])
                self.first_values = None
        if updated or self.forwards == NO_OPTIMIZER_AFTER:
            self.told = True
            self.note(NO_OPTIMIZER_UPDATED if updated else NO_OPTIMIZER)
