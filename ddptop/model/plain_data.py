"""The types of plain data that fields hold as it came: `JSON` (what json.loads gives and
json.dumps writes back) and the shape of an nsys report. Pure: no I/O, no imports of ours."""

from __future__ import annotations

from typing import TypeAlias, TypedDict

# Free-form plain data, recursively (a rank's script-side facts, nsys stats tables).
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None


class _NsysNote(TypedDict, total=False):
    note: str  # what could not be done, for the captures view


class NsysReport(_NsysNote):
    """What ddptop.run.nsys.nsys_report found after an nsys run (RunState.nsys, the summary's `nsys`)."""

    nsys: str  # the nsys binary that ran
    importer: str | None  # the QdstrmImporter that turned raw streams into reports, where one was needed
    files: list[str]  # every file nsys wrote, with its size
    stats: dict[str, str]  # report file name -> one line of its `nsys stats`
    reports: list[dict[str, JSON]]  # each report's summary, by rank and window
    errors: list[str]
