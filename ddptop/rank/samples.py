"""Samples a step: what the script feeds its model, counted once per micro-batch, or unknown.

The rule (README, "samples/s"): a micro-batch is one forward and then one backward. In each
step only one module counts: the first timed module (a DDP module, or without DDP an
outermost one) whose grad-enabled forward the step sees; its forward counts the first
dimension of the first tensor it gets, and counts again only after a backward (gradient
accumulation: one count per micro-batch). Forwards inside an optimizer step (an LBFGS
closure) count only when nothing has been counted in the step yet. So a GAN's second model,
a closure called many times and a model called twice before one backward count once.

Cross-check: when the script iterates a torch DataLoader that batches with `batch_size` B,
the first counted forwards after its batches must see B as their first dimension; if one does
not (a time-major [T, B] input), samples are unknown for the rest of the run: none are sent,
and a note says why, once.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

from ddptop.rank.forward_hooks import first_tensor

CHECKS = 3  # counted forwards after a DataLoader batch that are compared with its batch size


class SampleCount:
    def __init__(self, torch: Any, note: Callable[[str], None],
                 send_facts: Callable[[dict[str, Any]], None]) -> None:
        self.torch = torch
        self._note, self._send_facts = note, send_facts
        self._step = -1
        self._module: int | None = None  # id of the module that counts in this step
        self._counted = False  # in this step
        self._armed = True  # a backward ran since the last count
        self.loader_batch: int | None = None  # the batch size of the DataLoader that yielded last
        self._iters: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # iterator -> batches seen
        self._checks = CHECKS
        self.unknown = False
        self._batch_sent = False
        self._where: int | str | None = None  # where the last forward's first tensor was
        self.off = False  # a forked child's copy

    def install(self) -> None:
        """Know the rank's DataLoader iterators from their making (`__new__`, which returns
        before the iterator's own code runs): nothing of ddptop's is on the stack while a
        batch is made, so a DataLoader's error reaches the script with its own frames only."""
        from torch.utils.data import dataloader

        iters = self._iters

        def __new__(kind: type, *args: Any, **kwargs: Any) -> Any:  # noqa: ARG001 - __init__ takes them
            it: Any = object.__new__(kind)
            with contextlib.suppress(TypeError):  # not weakly referable: not watched
                iters[it] = 0
            return it

        dataloader._BaseDataLoaderIter.__new__ = staticmethod(__new__)  # type: ignore[method-assign,assignment]

    def _yielded(self) -> int | None:
        """The batch size of the DataLoader that yielded since the last look (its iterator's
        count of batches moved on); kept when none did; None when several did, batching
        differently, or one does not batch with a batch size."""
        sizes = set()
        for it, seen in list(self._iters.items()):
            n = getattr(it, "_num_yielded", seen)
            if n != seen:
                self._iters[it] = n
                auto = getattr(it, "_auto_collation", False)
                size = getattr(getattr(it, "_index_sampler", None), "batch_size", None) if auto else None
                sizes.add(size if isinstance(size, int) and size > 0 else None)
        if sizes:
            self.loader_batch = sizes.pop() if len(sizes) == 1 else None
        return self.loader_batch

    def backward(self) -> None:
        self._armed = True

    def _batch(self, args: Any, kwargs: dict[str, Any]) -> int | None:
        """`batch_size`, taken where an earlier forward had it (the first tensor was an
        argument itself, at that position or keyword): a model's call has one shape, so in
        the steady state this is one lookup, not a search of its arguments."""
        where, tensor = self._where, self.torch.Tensor
        value = kwargs.get(where) if isinstance(where, str) else (
            args[where] if where is not None and where < len(args) else None)
        if isinstance(value, tensor) and value.dim() >= 1:
            return int(value.shape[0])
        found = first_tensor(self.torch, (args, kwargs), depth=0, want_grad=False)
        self._where = next((i for i, a in enumerate(args) if a is found), None)
        if self._where is None:
            self._where = next((k for k, a in kwargs.items() if a is found), None)
        return int(found.shape[0]) if found is not None and found.dim() >= 1 else None

    def forward(self, module: Any, args: Any, kwargs: Any, step: int, in_optimizer: bool) -> float:
        """Samples a grad-enabled forward of `module` counts (0.0: none) in step `step`."""
        if step != self._step:
            self._step, self._module, self._counted = step, None, False
        if self._module is None:
            self._module = id(module)
        if id(module) != self._module or not self._armed or (in_optimizer and self._counted):
            return 0.0
        self._armed, self._counted = False, True
        batch = self._batch(args, kwargs or {})
        if not batch or self.unknown:
            return 0.0
        loader = self._yielded() if self._checks > 0 and not self.off else None
        if loader is not None and self._checks > 0:
            self._checks -= 1
            if batch != loader:
                self.unknown = True
                self._note(f"samples/s unknown: the model's first input dimension ({batch}) is not the "
                           f"DataLoader's batch size ({loader})")
                return 0.0
        if not self._batch_sent:
            self._batch_sent = True
            self._send_facts({"batch_size": batch})
        return float(batch)
