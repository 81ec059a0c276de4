"""What a piece of model code launches, counted exactly on any machine (`count_launches`).

A GPU decode step that launches thousands of kernels from Python spends most of its time in
the host, not the GPU. On a GPU a profile window counts the kernels (`trace_steps.py`); this
counts, on any device, what the same code asks of the device, from inside torch's dispatch:

- `operators`: aten operators dispatched from Python that produce data, each a kernel launch
  (or more) on a GPU: an in-place operator, or one whose output owns new storage;
- `views`: operators whose output only aliases an input (view, as_strided, t), or that only
  take memory (empty): no launch;
- `syncs`: values read back to the host (`item`, an operator answering a number): on a GPU
  each waits for the device;
- `transfers`: tensors moved or created onto a device by name (`.to(device)`, `.cuda()`,
  `torch.tensor(..., device=)`): on a GPU each is a host-to-device copy when the data is on
  the host; on a CPU, where host and device are one, every such request counts;
- `triton`: Triton kernel launches (counted under the interpreter, `TRITON_INTERPRET=1`;
  what the interpreter does inside a launch is not counted as operators);
- `host`: operators on host data only, where the code is told which tensors stay on the host
  on a GPU (`count_launches(host=...)`, a batch's host lengths): the host's own work, no
  launch, and reading their values back is no sync. Without it, a CPU run cannot tell such
  work from the device's and counts it as operators and syncs.

A count does not depend on the machine's speed, so a test can bound it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SYNCS = ("aten::item", "aten::_local_scalar_dense")
# no kernel: in place on the tensor's metadata only, or memory taken from the allocator
NO_LAUNCH = ("aten::detach_", "aten::lift_fresh", "aten::empty", "aten::empty_like",
             "aten::empty_strided", "aten::new_empty")  # fmt: skip
TRANSFER_FACTORIES = ("tensor", "as_tensor")
COUNTS = ("operators", "views", "syncs", "transfers", "triton", "host")


@dataclass
class Launches:
    """Counts of one stretch of code, by kind; `names` the operators by name."""

    operators: int = 0
    views: int = 0
    syncs: int = 0
    transfers: int = 0
    triton: int = 0
    host: int = 0
    names: Counter[str] = field(default_factory=Counter)

    @property
    def kernels(self) -> int:
        """What a GPU would launch: operators and Triton kernels."""
        return self.operators + self.triton

    def plus(self, other: Launches) -> Launches:
        return self._combined(other, 1)

    def minus(self, other: Launches) -> Launches:
        return self._combined(other, -1)

    def _combined(self, other: Launches, sign: int) -> Launches:
        names = Counter(self.names)
        for name, count in other.names.items():
            names[name] += sign * count
        return Launches(
            *(getattr(self, f) + sign * getattr(other, f) for f in COUNTS),
            names=+names,
        )


class _Dispatched(TorchDispatchMode):
    def __init__(self, counts: Launches, host: dict[int, torch.UntypedStorage]) -> None:
        super().__init__()
        self.counts = counts
        # host data: the storages named, and those made from them only, kept alive so that no
        # device tensor is given one's address while counting
        self.host = host

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        produced, read = _storages(out), _storages((args, kwargs))
        if read and read.keys() <= self.host.keys():
            self.host.update(produced)
            self.counts.host += 1
        elif name in SYNCS or (not produced and isinstance(out, bool | int | float)):
            self.counts.syncs += 1
        elif name in NO_LAUNCH:
            self.counts.views += 1
        elif func._schema.is_mutable or produced.keys() - read.keys():
            self.counts.operators += 1
            self.counts.names[name] += 1
        else:
            self.counts.views += 1
        return out


class _Named(TorchFunctionMode):
    def __init__(self, counts: Launches) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if _is_transfer(name, args, kwargs):
            self.counts.transfers += 1
        return func(*args, **kwargs)


def _is_transfer(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if name in TRANSFER_FACTORIES:
        return kwargs.get("device") is not None
    if name == "cuda":
        return True
    named = kwargs.get("device") is not None or any(
        isinstance(a, torch.device | str) for a in args[1:]
    )
    return name == "to" and named


def _storages(tree: Any) -> dict[int, torch.UntypedStorage]:
    """The storages of a tree's tensors, by address."""
    storages = (
        t.untyped_storage()
        for t in tree_leaves(tree)
        if isinstance(t, torch.Tensor) and t.device.type != "meta"
    )
    return {storage.data_ptr(): storage for storage in storages}


@contextlib.contextmanager
def count_launches(host: Iterable[torch.Tensor] = ()) -> Iterator[Launches]:
    """Count what the code inside launches (see the module's docstring); the counts fill in
    as it runs. `host`: tensors that a GPU run keeps on the host."""
    counts = Launches()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_triton_launches_counted(counts))
        stack.enter_context(_Named(counts))
        stack.enter_context(_Dispatched(counts, _storages(list(host))))
        yield counts


@contextlib.contextmanager
def _triton_launches_counted(counts: Launches) -> Iterator[None]:
    def counted(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        counts.triton += 1

    with on_triton_launch(counted):
        yield


@contextlib.contextmanager
def on_triton_launch(
    seen: Callable[[Any, tuple[Any, ...], dict[str, Any]], None],
) -> Iterator[None]:
    """Under the interpreter, `seen(kernel, args, launch keywords)` before each launch (the
    kernel: the interpreted function, its Python function `fn`, its `jit` keywords `kwargs`),
    which then runs with torch's modes off (what it does inside is not counted)."""
    from triton.runtime.interpreter import InterpretedFunction

    launch = InterpretedFunction.run

    def watched(self: InterpretedFunction, *args: Any, **kwargs: Any) -> Any:
        seen(self, args, kwargs)
        with _modes_off():
            return launch(self, *args, **kwargs)

    InterpretedFunction.run = watched
    try:
        yield
    finally:
        InterpretedFunction.run = launch


@contextlib.contextmanager
def _modes_off() -> Iterator[None]:
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C.DisableTorchFunction():
        yield
