"""Samples a step: what the script feeds its model, counted once per micro-batch, or unknown.

The rule (README, "samples/s"): a micro-batch is one forward and then one backward. One
module counts: of the timed modules (DDP modules, or without DDP the outermost ones), the one
whose grad-enabled forwards were fed new data most often so far (the first, on a tie); its forward counts the batch dimension of
the first tensor it gets, and counts again only after a backward (gradient accumulation: one
count per micro-batch). A forward fed what a timed module returned (a GAN's discriminator on
the generator's fake batch, detached or not) is not new data and counts nothing. Forwards
inside an optimizer step (an LBFGS closure) count only when nothing has been counted in the
step yet. So a GAN's second model, its fake batches, a second model stepping at another rate
(a teacher, a WGAN's generator), a closure called many times and a model called twice before
one backward count nothing more.

The batch dimension is the first, but for a module holding a time-major layer (an RNN or a
transformer layer without batch_first): its input is [T, B, ...], so the second. The layer's
own input checks it in the first forwards; where they disagree, samples are unknown.

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
OUTPUTS = 8  # timed modules' recent outputs whose data a later forward may be fed


class SampleCount:
    def __init__(self, torch: Any, note: Callable[[str], None],
                 send_facts: Callable[[dict[str, Any]], None]) -> None:
        self.torch = torch
        self._note, self._send_facts = note, send_facts
        self._step = -1
        self._counted = False  # in this step
        self._armed = True  # a backward ran since the last count
        self.loader_batch: int | None = None  # the batch size of the DataLoader that yielded last
        self._iters: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # iterator -> batches seen
        self._checks = CHECKS
        self.unknown = False
        self._batch_sent = False
        self._where: int | str | None = None  # where the last forward's first tensor was
        self.off = False  # a forked child's copy
        self._home: int | None = None  # id of the module whose forwards count, for the whole run
        self._fed: dict[int, int] = {}  # id of a timed module -> its forwards with grad fed new data
        self._outputs: list[Any] = []  # weak references to timed modules' recent outputs
        self._time_major: dict[int, Any] = {}  # id of a timed module -> its first time-major layer
        self._inner = _InnerCheck(self)
        self.retract = False  # the forward just counted turned out unknown: its count is taken back

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
        if not self._iters:  # no DataLoader iterator alive (a script that batches by hand): nothing moved
            return self.loader_batch
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

    def _batch(self, args: Any, kwargs: dict[str, Any], time_major: bool = False) -> int | None:
        """`batch_size`, taken where an earlier forward had it (the first tensor was an
        argument itself, at that position or keyword): a model's call has one shape, so in
        the steady state this is one lookup, not a search of its arguments. Time-major: the
        second dimension."""
        where, tensor, dim = self._where, self.torch.Tensor, 1 if time_major else 0
        value = kwargs.get(where) if isinstance(where, str) else (
            args[where] if where is not None and where < len(args) else None)
        if not isinstance(value, tensor):
            value = first_tensor(self.torch, (args, kwargs), depth=0, want_grad=False)
            self._where = next((i for i, a in enumerate(args) if a is value), None)
            if self._where is None:
                self._where = next((k for k, a in kwargs.items() if a is value), None)
        return int(value.shape[dim]) if value is not None and value.dim() > dim else None

    def disagree(self, counted: int, seen: int, layer: str) -> None:
        """The time-major layer saw another batch than the one counted: unknown from now."""
        if self.unknown:
            return
        self.unknown = self.retract = True
        self._send_facts({"batch_size": None})
        self._note(f"samples/s unknown: the model's {layer} (time-major) sees a batch of {seen}, "
                   f"its input's second dimension is {counted}")

    def watch_layout(self, module: Any) -> None:
        """A timed module: is it time-major (its first time-major layer, kept to check)?"""
        layer = time_major_layer(self.torch, module)
        if layer is not None:
            self._time_major[id(module)] = layer

    def output(self, output: Any) -> bool:
        """A timed module returned `output`: a forward fed its data is not fed new data.
        True when the count of this forward is taken back (its batch turned out unknown)."""
        found = first_tensor(self.torch, output, depth=0, want_grad=False)
        if found is not None:
            with contextlib.suppress(TypeError):
                self._outputs = [*self._outputs[-(OUTPUTS - 1):], weakref.ref(found)]
        retract, self.retract = self.retract, False
        return retract

    def _fed_by_a_module(self, args: Any, kwargs: dict[str, Any]) -> bool:
        found = first_tensor(self.torch, (args, kwargs), depth=0, want_grad=False)
        if found is None or not self._outputs:
            return False
        ptr = found.data_ptr()
        return any(t is not None and t.data_ptr() == ptr for t in (ref() for ref in self._outputs))

    def forward(self, module: Any, args: Any, kwargs: Any, step: int, in_optimizer: bool) -> float:
        """Samples a grad-enabled forward of `module` counts (0.0: none) in step `step`."""
        if step != self._step:
            self._step, self._counted = step, False
        kwargs = kwargs or {}
        if self._fed_by_a_module(args, kwargs):
            return 0.0
        fed = self._fed[id(module)] = self._fed.get(id(module), 0) + 1
        if self._home is None or (id(module) != self._home and fed > self._fed.get(self._home, 0)):
            self._home = id(module)  # fed new data more often than the one that counted (a teacher stepping now and then)
        if id(module) != self._home or not self._armed or (in_optimizer and self._counted):
            return 0.0
        self._armed, self._counted = False, True
        batch = self._batch(args, kwargs, id(module) in self._time_major)
        if not batch or self.unknown:
            return 0.0
        time_major = id(module) in self._time_major
        loader = self._yielded() if self._checks > 0 and not self.off else None
        if loader is not None and self._checks > 0:
            self._checks -= 1
            if batch != loader:
                self.unknown = True
                self._send_facts({"batch_size": None})
                self._note(f"samples/s unknown: the model's {'second (time-major)' if time_major else 'first'} "
                           f"input dimension ({batch}) is not the DataLoader's batch size ({loader})")
                return 0.0
        if self._checks > 0 and time_major:
            self._inner.expect(self._time_major[id(module)], batch)
        if not self._batch_sent:
            self._batch_sent = True
            self._send_facts({"batch_size": batch})
        return float(batch)


class _InnerCheck:
    """One forward pre-hook on a time-major layer, for the forward being counted: the batch
    its input holds (dimension 1) must be the batch counted. Removed after it has looked."""

    def __init__(self, count: SampleCount) -> None:
        self.count = count
        self.handle: Any = None

    def expect(self, layer: Any, batch: int) -> None:
        if self.handle is not None:
            self.handle.remove()
        self.count._checks -= 1

        def look(module: Any, args: Any) -> None:
            self.handle.remove()
            self.handle = None
            found = first_tensor(self.count.torch, args, depth=0, want_grad=False)
            if found is not None and found.dim() == 3 and int(found.shape[1]) != batch:
                self.count.disagree(batch, int(found.shape[1]), type(module).__name__)

        self.handle = layer.register_forward_pre_hook(look)


def time_major_layer(torch: Any, module: Any) -> Any:
    """The first layer in `module` that takes [T, B, ...] input: an RNN, LSTM or GRU, or a
    transformer layer or attention, without batch_first; None when there is none."""
    nn = torch.nn
    kinds = tuple(k for k in (getattr(nn, "RNNBase", None), getattr(nn, "MultiheadAttention", None),
                              getattr(nn, "TransformerEncoderLayer", None),
                              getattr(nn, "TransformerDecoderLayer", None)) if k is not None)
    for sub in module.modules():
        if isinstance(sub, kinds) and not getattr(sub, "batch_first", False):
            return sub
    return None
