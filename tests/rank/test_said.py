"""The rank's note that a loop updates the model without a torch.optim step: said for a
hand-written update, never for the outermost modules of a plain step without DDP (the model,
then the loss module, which has no parameters)."""

import torch
from torch import nn

from ddptop.rank.said import NO_OPTIMIZER_UPDATED, Said


class Probe:
    connected, forked = True, False

    def __init__(self):
        self.notes = []

    def info(self, facts, notes):
        self.notes += notes


def test_loss_module_after_the_model_is_no_update():
    """`criterion(model(x), y)` without DDP: the second outermost forward is the loss, whose
    missing parameter read as a changed one (the `single` preset's false note, issue 47)."""
    probe, model, loss = Probe(), nn.Linear(4, 2), nn.CrossEntropyLoss()
    said = Said(probe, 0)
    for module in (model, loss):
        said.forward_before_any_step(module, stepped=False)
    assert probe.notes == []
    said.forward_before_any_step(model, stepped=True)  # the optimizer stepped: nothing more to say
    assert probe.notes == []


def test_another_module_between_forwards_is_no_update():
    probe, model, head = Probe(), nn.Linear(4, 4), nn.Linear(4, 2)
    said = Said(probe, 0)
    for module in (model, head, model):
        said.forward_before_any_step(module, stepped=False)
    assert probe.notes == []


def test_hand_written_update_is_said_with_a_loss_module_in_between():
    probe, model, loss = Probe(), nn.Linear(4, 2), nn.MSELoss()
    said = Said(probe, 0)
    said.forward_before_any_step(model, stepped=False)
    said.forward_before_any_step(loss, stepped=False)
    with torch.no_grad():
        for p in model.parameters():
            p.data.add_(1.0)  # leaves _version as it was: the values tell
    said.forward_before_any_step(model, stepped=False)
    assert probe.notes == [NO_OPTIMIZER_UPDATED]
