"""NCCL_DEBUG=INFO logs: version, communicators, per-pair transports, rings, trees, env
overrides and TUNING collectives, parsed (parse, comms, lines) into plain records (model) and
rendered as text (render). Pure (lines in, data out); no I/O, no torch, no textual, no NVML.
Reading log files is ddptop.commands.nccl's."""

from ddptop.analysis.nccl.model import (
    ALGORITHMS,
    CLASS_ORDER,
    DATATYPES,
    IMPLEMENTED,
    MAX_LINE_CHARS,
    PROTOCOLS,
    SHOWN,
    CollectiveStat,
    Communicator,
    NcclReport,
    RankInfo,
    Transport,
    TreeNode,
    transport_class,
    transport_label,
)
from ddptop.analysis.nccl.parse import NcclParser, parse_lines, parse_text
from ddptop.analysis.nccl.render import (
    render_algo_matrix,
    render_facts,
    render_matrix,
    render_report,
    render_warnings,
    transport_matrix,
)

__all__ = [
    "ALGORITHMS", "CLASS_ORDER", "DATATYPES", "IMPLEMENTED", "MAX_LINE_CHARS", "PROTOCOLS", "SHOWN",
    "CollectiveStat", "Communicator", "NcclParser", "NcclReport", "RankInfo", "Transport", "TreeNode",
    "parse_lines", "parse_text", "render_algo_matrix", "render_facts", "render_matrix", "render_report",
    "render_warnings", "transport_class", "transport_label", "transport_matrix",
]
