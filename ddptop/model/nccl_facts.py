"""What the model reads of the NCCL report (ddptop.analysis.nccl.NcclReport, which lives above
model/ and so is not imported here): the facts summary.json keeps. Views that draw the whole
report (the Wiring view) narrow RunState.nccl to NcclReport themselves. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class TransportFacts(Protocol):
    @property
    def label(self) -> str: ...


class NcclFacts(Protocol):
    """The facts of ddptop.analysis.nccl.NcclReport that RunState's summary reads."""

    @property
    def nccl_lines(self) -> int: ...

    @property
    def version(self) -> str | None: ...

    @property
    def nranks(self) -> int | None: ...

    @property
    def network(self) -> str | None: ...

    @property
    def env(self) -> dict[str, str]: ...

    @property
    def transports(self) -> Mapping[tuple[int, int], TransportFacts]: ...

    @property
    def unknown_count(self) -> int: ...

    def algorithms(self) -> dict[str, set[str]]: ...
