"""SettingsScreen: every RunConfig knob as a control, presets as starting points.
Dismisses with the new, validated RunConfig (or None on cancel); the app then
stops the current run and starts one with it. For a user's own script (config.script)
only what reaches it is shown: the DDP knobs ddptop can set on its DDP() call, each
either the script's own or set by ddptop, and the run's ranks, warmup and stop."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Label, Select, Static, Switch

from ddptop.model.config import (
    CHOICES,
    DDP_KNOBS,
    PRESETS,
    SCRIPT_KNOBS,
    SCRIPT_PRESETS,
    ConfigError,
    RunConfig,
    preset_config,
)

CUSTOM = "custom"
SECTIONS = (
    ("Run", ("nproc", "model", "backend", "batch_size", "steps", "until_stopped", "warmup", "seed", "data", "workers",
             "lr")),
    ("DDP", ("ddp", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook",
             "powersgd_rank", "powersgd_start_iter", "autocast", "grad_accum")),
    ("NCCL", ("nccl_env",)),
    ("Fault injection", ("delay_rank", "delay_ms", "fail_rank", "fail_step")),
)
# A user's script: the knobs that reach it (the demo's model, batch, data, steps, faults do not).
SCRIPT_SECTIONS = (
    ("Run", ("nproc", "warmup", "script_steps")),
    ("DDP (applied to the script's own DDP() call)", SCRIPT_KNOBS),
    ("Timing", ("comm_timing", "comm_timing_every", "nccl_timing", "gloo_timing")),
    ("NCCL", ("nccl_env",)),
)
# What says which knobs reach a script: never a control of its own.
SCRIPT_ONLY = ("script", "ddp_apply", "script_steps")
HELP = {
    "nproc": "ranks on this node",
    "model": "auto: vit_l_32 on GPU, tiny_vit on CPU",
    "backend": "auto: nccl with CUDA, else gloo",
    "batch_size": "samples per rank per micro-batch",
    "steps": "optimizer steps per rank (unless until_stopped)",
    "until_stopped": "train until stopped (x, q): the demo in a terminal; steps then bounds nothing",
    "warmup": "steps left out of throughput figures",
    "seed": "random seed",
    "data": "loader: DataLoader + workers; device: batches made on the device",
    "workers": "DataLoader workers per rank",
    "lr": "learning rate",
    "ddp": "off: one process, no DDP (the per-GPU ceiling)",
    "static_graph": "DDP static_graph=True",
    "gradient_as_bucket_view": "grads alias the buckets (no copies)",
    "bucket_cap_mb": "all-reduce bucket size; smaller overlaps backward",
    "comm_hook": "gradient compression (lossy)",
    "powersgd_rank": "PowerSGD matrix approximation rank",
    "powersgd_start_iter": "plain all-reduce before this iteration",
    "autocast": "mixed-precision compute",
    "grad_accum": "micro-batches per optimizer step",
    "nccl_env": "NCCL env overrides: NAME=VALUE NAME=VALUE",
    "delay_rank": "rank to slow down (-1: none)", "delay_ms": "extra ms per step on delay_rank",
    "fail_rank": "rank to crash (-1: none)", "fail_step": "step at which fail_rank crashes",
    "script_steps": "stop after this many steps after warmup (0: the script's own end)",
    "comm_timing": "time each gradient bucket's all-reduce",
    "comm_timing_every": "GPU: time comm on one step in N (hook completions, NCCL kernel stamps)",
    "nccl_timing": "NCCL times the all-reduces: total comm live; costs ~1.4% of a ViT-L step (off: exposed only)",
    "gloo_timing": "CPU: a comm hook times each bucket: total comm live; ~60 us a bucket (off: exposed only)",
    "capture_memory": "captures also record memory (HTA's memory timeline); larger traces, slower profiled steps",
    "stop_grace": "seconds the ranks get to finish their stop handlers (a checkpoint) before SIGKILL",
    "cost_ab": "ddptop's own cost: seconds a block of each arm runs, in a random order (0: off)",
    "cost_ab_arms": "the arms: on (engaged), off (bypassed), aa (off again: A/A check), busy (calibration)",
    "cost_ab_blocks": "stop the run after this many blocks (0: at its own end)",
    "cost_ab_busy_pct": "the busy arm's extra wait, % of the step: the calibration the verdict is held to",
    "cost_ab_parts": "also time the hooks' parts (tracker, clock): a diagnosis, ~1.5 us a call",
    "phase_every": "time one step in this many (0: auto, every step for 50 then steps ~0.25 s apart): hooks' cost / K",
}
_DEFAULTS = RunConfig()


def knob_names(script: bool = False) -> list[str]:
    """The fields shown, in display order: for ddptop's trainer every RunConfig field but
    the preset and the script-only ones (new fields last); for a script, what reaches it."""
    if script:
        return [n for _, names in SCRIPT_SECTIONS for n in names]
    listed = [name for _, names in SECTIONS for name in names]
    extra = [f.name for f in dataclasses.fields(RunConfig)
             if f.name not in listed and f.name not in ("preset", *SCRIPT_ONLY)]
    return [n for n in listed if hasattr(_DEFAULTS, n)] + extra


def sections(script: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if script:
        return SCRIPT_SECTIONS
    return (*SECTIONS, ("Other", tuple(knob_names())))


def parse_env(raw: str) -> dict[str, str]:
    env = {}
    for item in raw.replace(",", " ").split():
        key, _, value = item.partition("=")
        if not key.strip() or "=" not in item:
            raise ConfigError(f"nccl_env wants NAME=VALUE pairs (e.g. NCCL_ALGO=Ring), got {item!r}")
        env[key.strip()] = value.strip()
    return env


def parse_knob(name: str, raw: str) -> Any:
    """What an Input control's text means for knob `name`, by the type of its default;
    ConfigError with a one-line reason when it means nothing (empty, letters in a number)."""
    default = getattr(_DEFAULTS, name)
    raw = raw.strip()
    if isinstance(default, dict):
        return parse_env(raw)
    if isinstance(default, bool) or not isinstance(default, int | float):
        return raw
    whole = isinstance(default, int)
    wanted = "a whole number" if whole else "a number"
    if not raw:
        raise ConfigError(f"{name} is empty: type {wanted}")
    try:
        return int(raw) if whole else float(raw)
    except ValueError:
        raise ConfigError(f"{name}: {raw!r} is not {wanted}") from None


def help_text(name: str) -> str:
    field = next((f for f in dataclasses.fields(RunConfig) if f.name == name), None)
    meta = field.metadata.get("help") if field is not None else None
    return meta or HELP.get(name, "")


def on_off(value: bool) -> str:
    return "on" if value else "off"


def make_control(name: str, value: Any) -> Widget:
    ident = f"knob-{name}"
    default = getattr(_DEFAULTS, name)
    if isinstance(default, bool):
        return Switch(value=bool(value), id=ident)
    if name in CHOICES:
        return Select([(c, c) for c in CHOICES[name]], value=value, allow_blank=False,
                      compact=True, id=ident)
    if isinstance(default, dict):
        return Input(" ".join(f"{k}={v}" for k, v in value.items()), compact=True, id=ident,
                     placeholder="none, e.g. NCCL_ALGO=Ring")
    # Number fields keep what was typed (no `type=` filter, which drops letters without a
    # word); the screen marks the field and says what is wrong while typing.
    if isinstance(default, int):
        return Input(str(value), compact=True, id=ident)
    if isinstance(default, float):
        return Input(f"{value:g}", compact=True, id=ident)
    return Input(str(value), compact=True, id=ident)


class SettingsScreen(Screen["RunConfig | None"]):
    AUTO_FOCUS = "#knob-preset"
    BINDINGS = [
        Binding("ctrl+s", "apply", "Apply & restart", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, config: RunConfig) -> None:
        super().__init__()
        self.config = config
        self.script = config.script
        self.names = knob_names(self.script)
        self.presets = list(SCRIPT_PRESETS if self.script else PRESETS)
        # a script's DDP knobs ddptop sets; the others stay what the script passes to DDP()
        self.applied = set(config.applied)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="settings-body"):
            yield Static(Text.assemble(
                ("Settings", "bold"), " for the next run. A preset sets the DDP knobs; "
                "change any knob after it. ", ("ctrl+s", "bold"), " applies: the current run "
                "stops cleanly and a new one starts", " with the same command" if self.script else "",
                ". ", ("esc", "bold"), " cancels.",
                *(("\nYour script's own DDP arguments are kept for every knob marked ",
                   ("script's", "bold"), "; a knob you change or a preset sets is ", ("set", "bold"),
                   " by ddptop where the script calls DDP(). Preset ", ("asis", "bold"),
                   " sets nothing.") if self.script else ())),
                id="settings-intro")
            with Horizontal(classes="knob"):
                yield Label("preset", classes="knob-name")
                options = [(name, name) for name in self.presets] + [(CUSTOM, CUSTOM)]
                preset = self.config.preset if self.config.preset in self.presets else CUSTOM
                yield Select(options, value=preset, allow_blank=False, compact=True, id="knob-preset")
                yield Label(self._preset_help(preset), classes="knob-help", id="preset-help")
            listed: set[str] = set()
            for title, section in sections(self.script):
                names = [n for n in section if n in self.names and n not in listed]
                if not names:
                    continue
                yield Label(title, classes="knob-section")
                for name in names:
                    listed.add(name)
                    with Horizontal(classes="knob"):
                        yield Label(name, classes="knob-name")
                        control = make_control(name, getattr(self.config, name))
                        yield control
                        if isinstance(control, Switch):
                            # The word, too: a switch's colour alone is lost on some terminals.
                            yield Label(on_off(control.value), id=f"state-{name}",
                                        classes="switch-state")
                        if self.script and name in SCRIPT_KNOBS:
                            yield Label(self._whose(name), id=f"whose-{name}", classes="switch-state")
                        yield Label(help_text(name), classes="knob-help", id=f"help-{name}")
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Apply & restart", variant="primary", id="apply", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
        # the focused field's whole description: a row's own help is cut at 80 columns
        yield Static("", id="settings-detail")
        yield Footer(show_command_palette=False)

    @staticmethod
    def _preset_help(name: str) -> str:
        return PRESETS[name].description if name in PRESETS else "your own combination of knobs"

    def _whose(self, name: str) -> str:
        return "set" if name in self.applied else "script's"

    def _show_whose(self) -> None:
        for name in SCRIPT_KNOBS:
            self.query_one(f"#whose-{name}", Label).update(self._whose(name))

    # --- reading and writing the controls ----------------------------------------------
    def _control(self, name: str) -> Any:
        return self.query_one(f"#knob-{name}")

    def values(self) -> dict[str, Any]:
        """The controls as a RunConfig dict (raises ConfigError on unparsable input)."""
        data: dict[str, Any] = {"preset": self._control("preset").value}
        if self.script:  # what is not shown stays the run's (the trainer's fields mean nothing to it)
            data = {**self.config.to_dict(), **data,
                    "ddp_apply": ",".join(k for k in SCRIPT_KNOBS if k in self.applied)}
        for name in self.names:
            control = self._control(name)
            data[name] = parse_knob(name, control.value) if isinstance(control, Input) else control.value
        return data

    def on_mount(self) -> None:
        self._remember()

    def reset(self, config: RunConfig) -> None:
        """Show `config` again (the screen is kept between openings): its values, preset,
        whose-knob marks; no error, no edits left from last time."""
        self.config, self.applied = config, set(config.applied)
        preset = config.preset if config.preset in self.presets else CUSTOM
        with self.prevent(Select.Changed):
            self._control("preset").value = preset
        self.query_one("#preset-help", Label).update(self._preset_help(preset))
        self._fill(config)
        if self.script:
            self._show_whose()
        self._error("")

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        # The row being edited is marked by a class: Textual does not restyle a focused
        # widget's siblings on :focus-within, so the row's name would not change.
        for row in self.query(".knob"):
            editing = event.widget in row.children
            row.set_class(editing, "editing")
            if editing:
                self._show_detail(row)

    def _show_detail(self, row: Widget) -> None:
        """The focused row's name and its whole help (or what is wrong with its text)."""
        name = str(row.query_one(".knob-name", Label).content)
        help_label = row.query_one(".knob-help", Label)
        bad = help_label.has_class("knob-bad")
        self.query_one("#settings-detail", Static).update(Text.assemble(
            (name, "bold"), ": ", (str(help_label.content), "bold #d7503c" if bad else "")))

    def _judge(self, control: Input) -> None:
        """Mark an Input whose text means nothing, and say why in place of its help line."""
        name = (control.id or "").removeprefix("knob-")
        try:
            parse_knob(name, control.value)
            reason = ""
        except ConfigError as exc:
            reason = str(exc)
        control.set_class(bool(reason), "bad")
        label = self.query_one(f"#help-{name}", Label)
        label.set_class(bool(reason), "knob-bad")
        label.update(reason or help_text(name))
        if control.has_focus and isinstance(control.parent, Widget):
            self._show_detail(control.parent)

    def _remember(self) -> None:
        """What each script knob's control shows now: a Changed event that leaves it so
        (a control announcing its first value) is no change by the user."""
        self._shown = {name: self._control(name).value for name in SCRIPT_KNOBS} if self.script else {}

    def _fill(self, config: RunConfig) -> None:
        with self.prevent(Input.Changed, Select.Changed, Switch.Changed):
            for name in self.names:
                control = self._control(name)
                value = getattr(config, name)
                if isinstance(control, Switch):
                    control.value = bool(value)
                    self.query_one(f"#state-{name}", Label).update(on_off(control.value))
                elif isinstance(control, Select):
                    control.value = value
                elif isinstance(value, dict):
                    control.value = " ".join(f"{k}={v}" for k, v in value.items())
                elif isinstance(value, float):
                    control.value = f"{value:g}"
                else:
                    control.value = str(value)
        for control in self.query(Input):  # a preset's values are good: clear the marks
            self._judge(control)
        self._remember()

    def current(self) -> RunConfig:
        return RunConfig.from_dict(self.values())

    # --- events -------------------------------------------------------------------------
    @on(Select.Changed, "#knob-preset")
    def _preset_changed(self, event: Select.Changed) -> None:
        event.stop()
        name = str(event.value)
        self.query_one("#preset-help", Label).update(self._preset_help(name))
        if name not in PRESETS:
            return
        try:
            base = RunConfig.from_dict({**self.values(), "preset": "baseline"})
        except ConfigError:
            base = self.config
        # `single` forced nproc to 1; leaving it restores the rank count.
        nproc = base.nproc if base.ddp else (self.config.nproc if self.config.ddp else 2)
        config = preset_config(name, base.with_changes(nproc=nproc))
        self._fill(config)
        if self.script:
            self.applied = set(config.applied)
            self._show_whose()
        self._error("")

    @on(Switch.Changed)
    @on(Select.Changed)
    @on(Input.Changed)
    def _knob_changed(self, event: Switch.Changed | Select.Changed | Input.Changed) -> None:
        ident = (event.control.id or "").removeprefix("knob-")
        if isinstance(event.control, Input):
            self._judge(event.control)
        if isinstance(event.control, Switch):
            self.query_one(f"#state-{ident}", Label).update(on_off(event.control.value))
        preset = self._control("preset").value
        if self.script and ident in SCRIPT_KNOBS and event.control.value != self._shown.get(ident):
            self.applied.add(ident)  # changed by hand: ddptop sets it
            self.query_one(f"#whose-{ident}", Label).update(self._whose(ident))
        if ident not in DDP_KNOBS or preset not in PRESETS:
            return
        try:
            shown = RunConfig.from_dict({**self.values(), "preset": "baseline"})
        except ConfigError:
            return  # half-typed input; judged again on the next change
        wanted = preset_config(str(preset), shown)
        if any(getattr(shown, k) != getattr(wanted, k) for k in DDP_KNOBS) or (
                self.script and shown.applied != wanted.applied):
            # Hand-tuned DDP knobs are no longer the preset: say so in the run's name.
            with self.prevent(Select.Changed):
                self._control("preset").value = CUSTOM
            self.query_one("#preset-help", Label).update(self._preset_help(CUSTOM))

    @on(Button.Pressed, "#apply")
    def _apply_pressed(self) -> None:
        self.action_apply()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()

    def _error(self, message: str) -> None:
        self.query_one("#settings-error", Static).update(
            Text(message, style="bold #d7503c") if message else "")

    def action_apply(self) -> None:
        try:
            config = self.current()
        except ConfigError as exc:
            self._error(str(exc))
            self.notify(str(exc), title="settings", severity="error")
            return
        self.dismiss(config)

    def action_cancel(self) -> None:
        self.dismiss(None)
