"""The app's actions on what the views show (pause, refresh rate, tabs, search, sort,
log filter): they change no run, so every viewer has them. Mixed into DdpTopApp."""

from __future__ import annotations

from textual.app import App
from textual.timer import Timer
from textual.widgets import TabbedContent

from ddptop.tui.keys import POINTERS, SORT_TOAST
from ddptop.tui.views import ViewRouter
from ddptop.tui.widgets.log_view import LogView
from ddptop.tui.widgets.rank_table import RankTable


class ViewActions(App[int]):
    views: ViewRouter
    refresh_s: float
    _ticks: Timer

    def refresh_views(self, force_runs: bool = False) -> None:
        self.views.refresh(force_runs)

    def action_pause(self) -> None:
        """Freeze what the views show (the run and its records go on), as top's space does."""
        self.views.paused = not self.views.paused
        self.clear_notifications()
        self.notify("display paused: space resumes (the run goes on)" if self.views.paused
                    else "display resumed", timeout=3600 if self.views.paused else 2)
        self.refresh_views()

    def action_refresh_every(self, factor: float) -> None:
        """+ and - halve and double the refresh interval (0.25 s to 8 s)."""
        self.refresh_s = min(8.0, max(0.25, self.refresh_s * factor))
        self._ticks.stop()
        self._ticks = self.set_interval(self.refresh_s, self.refresh_views)
        self.notify(f"refreshing every {self.refresh_s:g} s", timeout=2)

    def action_show_tab(self, tab: str) -> None:
        self.views.show_tab(tab)

    def action_search(self) -> None:
        if self.query_one(TabbedContent).active == "logs":
            self.query_one(LogView).action_search()
        else:
            self.notify("search is in the logs tab: 4, then / or F3 (ranks sort with F6, < > and i)")

    def action_sort(self) -> None:
        self.action_sort_step(1)

    def action_sort_step(self, delta: int) -> None:
        """F6, < and >: the rank table by the next (previous) column."""
        if self._sorting("F6"):
            self.query_one(RankTable).action_sort_column(delta)
            self._sort_toast()

    def action_sort_by(self, key: str) -> None:
        if self._sorting("P"):
            self.query_one(RankTable).sort_by(key)
            self._sort_toast()

    def action_invert_sort(self) -> None:
        if self._sorting("i"):
            self.query_one(RankTable).action_invert_sort()
            self._sort_toast()

    def _sorting(self, key: str) -> bool:
        if self.query_one(TabbedContent).active != "ranks":
            self.notify(f"{key} sorts the rank table: 1 shows it")
            return False
        return True

    def _sort_toast(self) -> None:
        """The order now, replacing the last sort's toast (issue 46: after i it went stale)."""
        for note in list(self._notifications):
            if str(note.message).startswith(SORT_TOAST):
                self._unnotify(note)
        table = self.query_one(RankTable)
        self.notify(f"{SORT_TOAST} {table.sort_label()} (F6 < > next column, i inverts)", timeout=3)

    def action_point_to(self, key: str) -> None:
        """An htop/nvitop key ddptop does not bind: where its feature is here."""
        self.notify(POINTERS[key], timeout=6)

    def action_filter_logs(self) -> None:
        self.action_show_tab("logs")
        self.query_one(LogView).action_cycle_filter()
