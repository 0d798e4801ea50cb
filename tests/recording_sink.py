"""A HubSink that records what the hub hands it, for the hub tests."""

from __future__ import annotations

from ddptop.wire import protocol


class Sink:
    def __init__(self) -> None:
        self.messages: list[protocol.Message] = []
        self.dropped: list[str] = []
        self.refused: list[str] = []
        self.gone: list[int] = []

    def hub_message(self, msg, now):
        self.messages.append(msg)

    def hub_dropped(self, reason):
        self.dropped.append(reason)

    def hub_refused(self, reason):
        self.refused.append(reason)

    def hub_admit(self, hello):
        return None

    def hub_disconnected(self, rank):
        self.gone.append(rank)

    def steps(self, rank: int) -> list[int]:
        return [
            r["step"]
            for m in self.messages
            if isinstance(m, protocol.Steps) and m.rank == rank
            for r in m.records
        ]
