"""Where forwards and backwards are seen: the outermost modules of a step, and backward's
start, compute end and return.

Without a DDP module, global module hooks (`OutermostHooks`) find the outermost modules of
the first step (which are then hooked themselves, and the global hooks dropped: they cost
every submodule call). A hook on the forward's output marks backward's start; autograd
callbacks mark the end of its compute and, chained after DDP's own, its return
(`BackwardMarks`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ddptop.rank.steps import StepTracker

Guard = Callable[[Callable[..., Any]], Callable[..., Any]]


class OutermostHooks:
    """Global forward hooks that call `on_pre`/`on_post` for the outermost module of each
    forward only, and remember those modules (`tops`)."""

    def __init__(self, torch: Any, guard: Guard, on_pre: Callable[..., None],
                 on_post: Callable[..., None]) -> None:
        self.torch = torch
        self._guard = guard
        self._on_pre = on_pre
        self._on_post = on_post
        self.tops: dict[int, Any] = {}  # id -> module seen as outermost
        self._depth = 0
        self._handles: list[Any] = []

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", lambda: False)

        def pre(module: Any, args: Any) -> None:
            if compiling():
                return
            self._depth += 1
            if self._depth == 1:
                self.tops.setdefault(id(module), module)
                self._on_pre(module, args, {})

        def post(module: Any, args: Any, output: Any) -> None:
            if compiling():
                return
            self._depth -= 1
            if self._depth == 0:
                self._on_post(module, args, output)

        self._handles = [nn_module.register_module_forward_pre_hook(self._guard(pre)),
                         nn_module.register_module_forward_hook(self._guard(post), always_call=True)]

    def drop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._depth = 0

    def take_tops(self) -> list[Any]:
        tops = list(self.tops.values())
        self.tops = {}
        return tops


class ModuleHooks:
    """The forward hooks on the modules the instrument times (each DDP module, or the top
    modules of a script without DDP), removable and restorable (cost_ab bypasses them)."""

    def __init__(self, pre: Callable[..., Any], post: Callable[..., Any]) -> None:
        self._pre, self._post = pre, post
        self.modules: list[Any] = []
        self._handles: list[Any] = []

    def add(self, module: Any) -> None:
        self.modules.append(module)
        self._hook(module)

    def _hook(self, module: Any) -> None:
        self._handles += [module.register_forward_pre_hook(self._pre, with_kwargs=True),
                          module.register_forward_hook(self._post, always_call=True)]

    def follow(self, wrapper: Any, inner_of: dict[int, Any]) -> None:
        """torch.compile(module) of a module timed here: its hooks go to the wrapper (an
        OptimizedModule), which runs them outside the compiled region (on the module itself the
        compiler traces them: graph breaks, recompiles, its warnings); `inner_of` learns which
        module the wrapper runs."""
        inner = getattr(wrapper, "_orig_mod", None)
        if inner is None or not any(m is inner for m in self.modules):
            return
        self.modules = [wrapper if m is inner else m for m in self.modules]
        inner_of[id(wrapper)] = inner
        self.attach()

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def release(self) -> None:
        """The run is over: hooks off, the modules let go (freed when the script lets go)."""
        self.detach()
        self.modules = []

    def attach(self) -> None:
        self.detach()
        for module in self.modules:
            self._hook(module)


class BackwardMarks:
    """Marks backward's phases on the step tracker, once per backward."""

    def __init__(self, torch: Any, tracker: StepTracker, guard: Guard,
                 on_start: Callable[[], None] = lambda: None) -> None:
        self.torch = torch
        self._on_start = on_start  # the sample count: a micro-batch ended
        self.tracker = tracker
        self._in_backward = False
        # the backward waits for DDP's all-reduces (not under no_sync): a forward watched since the
        # last backward syncs (a GAN's two DDPs: either one)
        self._waits = self._will_wait = False
        self._engine = torch.autograd.Variable._execution_engine
        self._returned_at: float | None = None  # host time the watched forward returned
        # guarded once (a wrapper made per step costs more than the mark itself)
        self._compute_end, self._returned = guard(self._bwd_end), guard(self._bwd_ret)
        self.hook = guard(self.started)

    def watch(self, tensor: Any, waits: bool = True) -> None:
        """Backward starts when `tensor`'s gradient arrives: a pre-hook on its grad_fn (one C++
        call), or a tensor hook where it has none (a leaf). `waits`: DDP will all-reduce in
        it; a micro-batch under no_sync returns when its compute ends (no return mark: a
        stamp less, ~10 us of host time on a GPU)."""
        if tensor is None:
            return
        self._returned_at = time.perf_counter()
        self._will_wait = self._will_wait or waits
        node = tensor.grad_fn
        if node is not None and hasattr(node, "register_prehook"):
            node.register_prehook(self.hook)
        else:
            tensor.register_hook(self.hook)

    def started(self, grad: Any) -> None:  # noqa: ARG002 - a hook on the forward's output
        if self._in_backward:
            return None
        self._in_backward = True
        self._waits, self._will_wait = self._will_wait, False
        if self._returned_at is not None:
            # host time from the forward's return to here: the loss, and whatever the script runs
            # between them (nanoGPT fetches the next batch there); a GPU's forward phase holds it
            gap = 1000.0 * (time.perf_counter() - self._returned_at)
            self.tracker.extra["host_gap_ms"] = self.tracker.extra.get("host_gap_ms", 0.0) + gap
            self._returned_at = None
        self._on_start()
        self.tracker.mark("bwd")
        self._engine.queue_callback(self._compute_end)
        return None

    def _bwd_end(self) -> None:
        self.tracker.mark("bwd_end")
        if not self._waits:
            self._in_backward = False
            return
        # queued now, so it runs after DDP's finalize (queued during backward): backward has
        # returned, every all-reduce is done and its result copied back
        self._engine.queue_callback(self._returned)

    def _bwd_ret(self) -> None:
        self._in_backward = False
        self.tracker.mark("bwd_ret")


def loss_like(torch: Any, output: Any) -> Any:
    """The tensor in a forward's output whose gradient arrives first in backward: a scalar
    that requires grad (a loss computed inside the model), else the first that does."""
    scalar = first_tensor(torch, output, depth=0, want_grad=True, scalar=True)
    return scalar if scalar is not None else first_tensor(torch, output, depth=0, want_grad=True)


def first_tensor(torch: Any, value: Any, depth: int, want_grad: bool, scalar: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        if want_grad and not value.requires_grad:
            return None
        if scalar and value.dim() != 0:
            return None
        return value
    if depth > 3:
        return None
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "to_tuple"):  # Hugging Face ModelOutput
        items = value.to_tuple()
    else:
        return None
    for item in list(items)[:16]:
        found = first_tensor(torch, item, depth + 1, want_grad, scalar)
        if found is not None:
            return found
    return None
