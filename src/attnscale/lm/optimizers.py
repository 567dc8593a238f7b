"""The optimiser a training run steps (``TrainConfig.optimizer``): AdamW, or Muon beside AdamW.

"adamw": one ``torch.optim.AdamW`` over every parameter, weight decay on the matrices only.
"muon": ``torch.optim.Muon`` for the transformer blocks' 2-D weight matrices (attention's q, k, v and
output projections, the MLP's two), with ``adjust_lr_fn="match_rms_adamw"`` (Liu et al. 2025,
Moonlight; the setting Kimi K2's MuonClip uses: each update's RMS is matched to AdamW's, so one rate
serves both parts), momentum 0.95, Nesterov, 5 Newton-Schulz steps; and AdamW, with the betas, eps and
rate of "adamw", for everything else: the embeddings and the read-out (2-D, outside the blocks, with
weight decay), every norm's gain and bias, the linear biases and the score scale's own parameters
(qk-norm's gains, a learned temperature), none of which decays. Both parts decay by the same rule
(``weight_decay``, or ``weight_decay / lr`` where the decay is independent of the rate) and take the
same rate at every step: the schedule sets every group's ``lr``.

``MuonAdamW`` steps the two as one optimiser for the loop, the watch's actions and the checkpoint:
``param_groups`` (AdamW's, then Muon's: the same dicts, so a rate set on one is set where it acts),
``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict``. Muon has no fused kernel, so a step
whose loss or gradients are not finite is skipped by the host (``defaults["fused"]`` is False)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OPTIMIZERS", "MuonAdamW", "build_optimizer", "muon_split"]

OPTIMIZERS = ("adamw", "muon")


def muon_split(model: torch.nn.Module) -> tuple[list, list, list]:
    """(Muon's, AdamW's decayed, AdamW's not decayed): the blocks' matrices; the other matrices (embeddings,
    read-out); every parameter of fewer than 2 dimensions. A tied read-out is the embedding, counted once."""
    muon, decay, rest = [], [], []
    for name, p in model.named_parameters():
        if p.dim() < 2:
            rest.append(p)
        elif name.startswith("blocks.") and p.dim() == 2:
            muon.append(p)
        else:
            decay.append(p)
    return muon, decay, rest


class MuonAdamW:
    """``torch.optim.Muon`` and ``torch.optim.AdamW`` over disjoint parameters, stepped as one optimiser."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw
        self.param_groups = [*adamw.param_groups, *muon.param_groups]
        self.defaults = {"fused": False}  # no fused Muon: the loop decides a skip on the host

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.adamw.step()
        self.muon.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adamw.load_state_dict(state["adamw"])
        self.muon.load_state_dict(state["muon"])
        # load_state_dict makes each inner optimiser's groups anew: ours must be those, not the old dicts
        self.param_groups = [*self.adamw.param_groups, *self.muon.param_groups]


def build_optimizer(model: torch.nn.Module, name: str, *, lr: float, weight_decay: float, betas: tuple[float, float],
                    eps: float, fused: bool) -> "torch.optim.AdamW | MuonAdamW":
    """The optimiser ``name`` (``OPTIMIZERS``) over ``model``'s parameters, as the module's docstring says.
    ``weight_decay``: what AdamW and Muon are given (the rate multiplies it in both); ``fused``: AdamW's
    one-kernel step, which can also skip an update on the device."""
    muon, decay, rest = muon_split(model)
    if name == "adamw":  # every matrix, in the model's order (a checkpoint's optimiser state is kept by position)
        muon, decay = [], [p for p in model.parameters() if p.dim() >= 2]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                              lr=lr, betas=betas, eps=eps, fused=fused)
    if name == "adamw":
        return adamw
    return MuonAdamW(torch.optim.Muon(muon, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"), adamw)
