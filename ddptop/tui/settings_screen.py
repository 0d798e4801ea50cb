"""SettingsScreen: every RunConfig knob as a control, presets as starting points.
Dismisses with the new, validated RunConfig (or None on cancel); the app then
stops the current run and starts one with it."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Label, Select, Static, Switch

from ddptop.config import CHOICES, DDP_KNOBS, PRESETS, ConfigError, RunConfig, preset_config

CUSTOM = "custom"
SECTIONS = (
    ("Run", ("nproc", "model", "backend", "batch_size", "steps", "warmup", "seed", "data", "workers",
             "lr")),
    ("DDP", ("ddp", "static_graph", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook",
             "powersgd_rank", "powersgd_start_iter", "autocast", "grad_accum")),
    ("NCCL", ("nccl_env",)),
    ("Fault injection", ("delay_rank", "delay_ms", "fail_rank", "fail_step")),
)
HELP = {
    "nproc": "ranks on this node",
    "model": "auto: vit_l_32 on GPU, tiny_vit on CPU",
    "backend": "auto: nccl with CUDA, else gloo",
    "batch_size": "samples per rank per micro-batch",
    "steps": "optimizer steps per rank",
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
    "delay_rank": "rank to slow down (-1: none)",
    "delay_ms": "extra ms per step on delay_rank",
    "fail_rank": "rank to crash (-1: none)",
    "fail_step": "step at which fail_rank crashes",
}
_DEFAULTS = RunConfig()


def knob_names() -> list[str]:
    """Every RunConfig field but the preset, in display order (new fields last)."""
    listed = [name for _, names in SECTIONS for name in names]
    extra = [f.name for f in dataclasses.fields(RunConfig) if f.name not in listed and f.name != "preset"]
    return [n for n in listed if hasattr(_DEFAULTS, n)] + extra


def parse_env(raw: str) -> dict[str, str]:
    env = {}
    for item in raw.replace(",", " ").split():
        if "=" not in item:
            raise ConfigError(f"nccl_env: expected NAME=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        env[key.strip()] = value.strip()
    return env


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
    if isinstance(default, int):
        return Input(str(value), type="integer", compact=True, id=ident)
    if isinstance(default, float):
        return Input(f"{value:g}", type="number", compact=True, id=ident)
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

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="settings-body"):
            yield Static(Text.assemble(
                ("Settings", "bold"), " for the next run. A preset sets the DDP knobs; "
                "change any knob after it. ", ("ctrl+s", "bold"), " applies: the current run "
                "stops cleanly and a new one starts. ", ("esc", "bold"), " cancels."),
                id="settings-intro")
            with Horizontal(classes="knob"):
                yield Label("preset", classes="knob-name")
                options = [(name, name) for name in PRESETS] + [(CUSTOM, CUSTOM)]
                preset = self.config.preset if self.config.preset in PRESETS else CUSTOM
                yield Select(options, value=preset, allow_blank=False, compact=True, id="knob-preset")
                yield Label(self._preset_help(preset), classes="knob-help", id="preset-help")
            listed: set[str] = set()
            for title, names in (*SECTIONS, ("Other", tuple(knob_names()))):
                names = [n for n in names if n in knob_names() and n not in listed]
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
                        yield Label(help_text(name), classes="knob-help")
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Apply & restart", variant="primary", id="apply", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
        yield Footer()

    @staticmethod
    def _preset_help(name: str) -> str:
        return PRESETS[name].description if name in PRESETS else "your own combination of knobs"

    # --- reading and writing the controls ----------------------------------------------
    def _control(self, name: str) -> Any:
        return self.query_one(f"#knob-{name}")

    def values(self) -> dict[str, Any]:
        """The controls as a RunConfig dict (raises ConfigError on unparsable input)."""
        data: dict[str, Any] = {"preset": self._control("preset").value}
        for name in knob_names():
            control = self._control(name)
            default = getattr(_DEFAULTS, name)
            raw = control.value
            if isinstance(control, Input):
                raw = raw.strip()
                try:
                    if isinstance(default, dict):
                        raw = parse_env(raw)
                    elif isinstance(default, bool):
                        raw = bool(raw)
                    elif isinstance(default, int):
                        raw = int(raw)
                    elif isinstance(default, float):
                        raw = float(raw)
                except ValueError:
                    raise ConfigError(f"{name}: {control.value!r} is not a valid "
                                      f"{type(default).__name__}") from None
            data[name] = raw
        return data

    def _fill(self, config: RunConfig) -> None:
        with self.prevent(Input.Changed, Select.Changed, Switch.Changed):
            for name in knob_names():
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
        self._fill(preset_config(name, base.with_changes(nproc=nproc)))
        self._error("")

    @on(Switch.Changed)
    @on(Select.Changed)
    @on(Input.Changed)
    def _knob_changed(self, event: Switch.Changed | Select.Changed | Input.Changed) -> None:
        ident = (event.control.id or "").removeprefix("knob-")
        if isinstance(event.control, Switch):
            self.query_one(f"#state-{ident}", Label).update(on_off(event.control.value))
        preset = self._control("preset").value
        if ident not in DDP_KNOBS or preset not in PRESETS:
            return
        try:
            shown = RunConfig.from_dict({**self.values(), "preset": "baseline"})
        except ConfigError:
            return  # half-typed input; judged again on the next change
        wanted = preset_config(str(preset), shown)
        if any(getattr(shown, k) != getattr(wanted, k) for k in DDP_KNOBS):
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
