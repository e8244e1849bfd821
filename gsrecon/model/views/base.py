"""The interface of a per-view module and the set of a run's modules.

A per-view module learns something about each training view that the Gaussians should not absorb (a photo's
exposure, a camera's pose error). It owns its parameters, its optimiser (and schedule), a regularisation term
that joins the loss, its checkpoint state, and a policy for test views, which it has no parameters for. It acts
in one or both places of a step: on the cameras before the render (:meth:`ViewModule.adjust_cameras`) and on the
rendered image before the loss (:meth:`ViewModule.adjust_image`); and on a test view's camera before it is scored
(:meth:`ViewModule.eval_cameras`). A step's values reach a module as arguments and leave it as return values (the
render as it reaches a module's composite is given to :meth:`ViewModule.render_term`; the step's render, after what the
modules draw besides the Gaussians, to :meth:`ViewModule.adjust_image` and :meth:`ViewModule.regularization`): no
module keeps one call's values for a later call.

A run's modules are :data:`~gsrecon.registry.VIEW_REGISTRY` entries of one shape, ``{name, ...options}``, in the
``views:`` entry map (``{key: {name, ...options}}``): ``views.appearance`` and ``views.pose_opt`` each take only
modules of their kind (:data:`VIEW_SECTIONS`; ``name: none`` is off, ``mode`` an alias of ``name``), other keys any
module (e.g. a plugin's). The old shape, top-level ``appearance:`` and ``pose_opt:`` sections, is read for one
release (:func:`fold_view_section`). The trainer sees the modules only through :class:`ViewModules`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gsrecon.component import RunChecked
from gsrecon.config import ConfigError
from gsrecon.distributed import DistributedContext
from gsrecon.errors import InputError, is_out_of_memory, last_line
from gsrecon.model.views.optim import VisitedRowsAdam
from gsrecon.optim import LRScheduler, Optimizer, load_optimizer_state
from gsrecon.registry import VIEW_REGISTRY

if TYPE_CHECKING:
    from gsrecon.cameras import Cameras
    from gsrecon.data.pipeline import Batch, DataPipeline
    from gsrecon.data.scene import Frame
    from gsrecon.render.base import RenderOutput

# The views: keys that each hold one per-view module of a kind (ViewModule.kind), and that kind.
VIEW_SECTIONS = {"appearance": "appearance", "pose_opt": "pose"}
EvalAdjust = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (render, gt) [H, W, 3] -> the pair to score
RenderFn = Callable[["Batch"], "RenderOutput"]  # the scene rendered from a batch's cameras


class ViewModule(torch.nn.Module, RunChecked):
    """Base class: learns nothing and changes nothing; subclasses override what they need. What a module reads from
    the run's data before training belongs in :meth:`~gsrecon.component.RunChecked.setup` (``run.data``,
    ``run.log``), which is not called where a trained module only renders (inference)."""

    kind = ""  # the kind of module: the section of that kind takes it (VIEW_SECTIONS); "": only views: entries
    moves_cameras = False  # whether adjust_cameras moves the cameras (then the renderer must give their gradients)
    export_note = ""  # what an export of the Gaussians leaves out of the module ("": nothing it draws)
    sets_transients_aside = False  # whether it sets transients aside from the loss (the strategies then delay growth)

    @dataclass
    class Config:
        lr: float = 1e-3  # Adam learning rate of the module's parameters

        def __post_init__(self) -> None:
            if not (math.isfinite(self.lr) and self.lr >= 0):
                raise ValueError(f"lr must be a finite number >= 0, got {self.lr!r}")
            if self.lr > 1:
                raise ValueError(
                    f"lr must be at most 1 (Adam moves each parameter by about lr a step: a radian of a pose, a "
                    f"colour's whole range), got {self.lr!r}"
                )

    def __init__(self, cfg: Any, train_names: list[str]) -> None:
        super().__init__()
        self.cfg = cfg
        self.index = {name: i for i, name in enumerate(train_names)}  # training view name -> row of its parameters

    def frames_by_row(self, data: DataPipeline) -> list[Frame]:
        """The training frames of ``data``, in the order of the module's parameter rows."""
        return sorted(data.train_frames, key=lambda frame: self.index[frame.name])

    def rows(self, names: list[str], device: torch.device) -> Tensor:
        """The parameter rows [B] of the training views ``names``."""
        return torch.tensor([self.index[name] for name in names], device=device)

    def trained_rows(self, names: list[str], device: torch.device) -> Tensor | None:
        """The rows [B] of the module's parameters that a step on the training views ``names`` trains (the other
        rows keep their values and moments); None: every row. A module whose parameters are not one row per
        training view returns None."""
        return self.rows(names, device)

    def build_optimizer(self) -> Optimizer | None:
        """The module's own optimiser (None for a module without parameters): Adam at ``cfg.lr`` over the rows of
        the views each step trains on (:class:`~gsrecon.model.views.optim.VisitedRowsAdam`)."""
        params = list(self.parameters())
        if not params:
            return None
        return VisitedRowsAdam([{"params": params, "lr": self.cfg.lr, "name": type(self).__name__}], lr=self.cfg.lr)

    def build_scheduler(self, optimizer: Optimizer) -> LRScheduler | None:
        """The schedule of the module's learning rate, stepped after each optimiser step; None keeps it constant."""
        return None

    def adjust_cameras(self, batch: Batch) -> Batch:
        """The training ``batch`` with its cameras as this module sees them (before the render)."""
        return batch

    def camera_poses(self, viewmats: Tensor, names: list[str]) -> Tensor:
        """The training views ``names`` as this module places them, from their given world-to-camera ``viewmats``
        [B, 4, 4] (what :meth:`adjust_cameras` renders them from; the viewer and ``cameras.json`` show them)."""
        return viewmats

    def composite(self, out: RenderOutput, cameras: Cameras, backgrounds: Tensor) -> RenderOutput:
        """The render ``out`` of ``cameras`` over ``backgrounds`` [C, 3] with what the module draws besides the
        Gaussians (training and test views and any other camera alike; before :meth:`adjust_image`)."""
        return out

    def render_term(self, out: RenderOutput) -> Tensor | None:
        """The module's weighted regularisation term of a training step's render ``out`` as it reaches the module's
        :meth:`composite` (a term of the Gaussians' own render, e.g. of its opacity), or None; it joins the module's
        :meth:`regularization`."""
        return None

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput) -> Tensor:
        """The rendered ``image`` [B, H, W, 3] of training ``batch`` as its photos saw it (before the loss); ``out`` is
        the step's render of ``batch`` (after the modules' :meth:`composite`: its alpha, its depth)."""
        return image

    def regularization(self, out: RenderOutput, batch: Batch) -> Tensor | None:
        """The module's weighted regularisation term of the training step whose render of ``batch`` is ``out`` (after
        the modules' :meth:`composite`), or None."""
        return None

    def set_aside_in(
        self, views: ViewModules, batches: Callable[[], Iterable[Batch]], render: RenderFn
    ) -> Iterator[tuple[Batch, Tensor]]:
        """Each batch of the training views ``batches()`` (cameras as ``views`` place them) with the pixels [B, H, W,
        1] bool the module sets aside in its photos from the scene as ``render`` draws it: a module that sets
        transients aside (``sets_transients_aside``) says which."""
        raise NotImplementedError(f"{type(self).__name__} sets no pixel aside")

    def eval_adjust(self) -> EvalAdjust | None:
        """How a test view is scored, having no parameters of its own: None scores the render as it is."""
        return None

    def eval_cameras(self, batch: Batch, render: RenderFn) -> Batch:
        """A test view's ``batch`` with the cameras it is scored from (``render`` draws the scene from a batch):
        the base scores it where it was given."""
        return batch


class ViewModules:
    """A run's per-view modules by key, each with its optimiser; what the trainer calls."""

    def __init__(self, modules: dict[str, ViewModule]) -> None:
        self.modules = modules
        self.optimizers = {key: module.build_optimizer() for key, module in modules.items()}
        self.schedulers = {
            key: None if (optimizer := self.optimizers[key]) is None else module.build_scheduler(optimizer)
            for key, module in modules.items()
        }

    def __bool__(self) -> bool:
        return bool(self.modules)

    def adjust_cameras(self, batch: Batch) -> Batch:
        for module in self.modules.values():
            batch = module.adjust_cameras(batch)
        return batch

    def camera_poses(self, viewmats: Tensor, names: list[str]) -> Tensor:
        """The training views ``names`` [B, 4, 4] as the modules place them (see :meth:`ViewModule.camera_poses`)."""
        for module in self.modules.values():
            viewmats = module.camera_poses(viewmats, names)
        return viewmats

    def composite(self, out: RenderOutput, batch: Batch) -> RenderOutput:
        """``out``, the render of ``batch``'s cameras over its backgrounds, with what the modules draw behind the
        Gaussians (see :meth:`ViewModule.composite`)."""
        for module in self.modules.values():
            out = module.composite(out, batch.cameras, batch.backgrounds)
        return out

    def draw(self, out: RenderOutput, batch: Batch) -> tuple[RenderOutput, dict[str, Tensor]]:
        """A training step's :meth:`composite` of ``out``, with the modules' terms of the render as each module's
        composite receives it (``{key: term}``, :meth:`ViewModule.render_term`; for :meth:`regularization`)."""
        terms = {}
        for key, module in self.modules.items():
            if (term := module.render_term(out)) is not None:
                terms[key] = term
            out = module.composite(out, batch.cameras, batch.backgrounds)
        return out, terms

    def adjust_image(self, image: Tensor, batch: Batch, out: RenderOutput, until: ViewModule | None = None) -> Tensor:
        """The rendered ``image`` [B, H, W, 3] of training ``batch`` as the modules adjust it in order (see
        :meth:`ViewModule.adjust_image`; ``out``: the step's render of ``batch``); with ``until``, as that module
        sees it: adjusted by the modules before it only."""
        for module in self.modules.values():
            if module is until:
                break
            image = module.adjust_image(image, batch, out)
        return image

    def seen_by(
        self, module: ViewModule, batches: Callable[[], Iterable[Batch]], render: RenderFn
    ) -> Iterator[tuple[Batch, Tensor, RenderOutput]]:
        """Each batch of ``batches()`` with its cameras as the modules place them, its render's image [B, H, W, 3] as
        ``module`` sees it (adjusted by the modules before it) and the render."""
        for batch in batches():
            batch = self.adjust_cameras(batch)
            out = render(batch)
            yield batch, self.adjust_image(out.image, batch, out, until=module), out

    def regularization(self, out: RenderOutput, batch: Batch, drawn: dict[str, Tensor]) -> dict[str, Tensor]:
        """``{key: term}`` of the modules that have one in the training step whose render of ``batch`` is ``out`` (the
        loss's ``train/loss/<key>``): each module's term of the render ``drawn`` (:meth:`draw`) and its
        :meth:`ViewModule.regularization`, summed."""
        terms = {}
        for key, module in self.modules.items():
            parts = [term for term in (drawn.get(key), module.regularization(out, batch)) if term is not None]
            if parts:
                terms[key] = parts[0] if len(parts) == 1 else sum(parts)
        return terms

    def step(self, names: list[str], dist: DistributedContext) -> None:
        """After ``backward`` of a step on the training views ``names``: sum the gradients over torchrun processes,
        step each optimiser (over the rows of the views any process trained on) and clear it."""
        for key, optimizer in self.optimizers.items():
            if optimizer is None:
                continue
            module = self.modules[key]
            dist.all_reduce_grads(dict(module.named_parameters()))
            if isinstance(optimizer, VisitedRowsAdam):
                optimizer.step(rows_trained_anywhere(module, names, dist))
            else:
                optimizer.step()  # a module's own optimiser (build_optimizer overridden) steps every row
            optimizer.zero_grad(set_to_none=True)
            if self.schedulers[key] is not None:
                self.schedulers[key].step()

    def eval_cameras(self, batch: Batch, render: RenderFn) -> Batch:
        """A test view's ``batch`` with the cameras each module's test-view policy scores it from, in order."""
        for module in self.modules.values():
            batch = module.eval_cameras(batch, render)
        return batch

    def eval_adjust(self) -> EvalAdjust | None:
        """The test-view policies of the modules that have one, applied in order; None when none has."""
        adjusts = [adjust for module in self.modules.values() if (adjust := module.eval_adjust()) is not None]
        if not adjusts:
            return None

        def adjust(render: Tensor, gt: Tensor) -> tuple[Tensor, Tensor]:
            for one in adjusts:
                render, gt = one(render, gt)
            return render, gt

        return adjust

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint entry: each module's parameters, optimiser and schedule state, by key."""
        return {
            key: {
                "module": {name: value.detach().clone() for name, value in module.state_dict().items()},
                "optimizer": None if self.optimizers[key] is None else self.optimizers[key].state_dict(),
                **({"scheduler": scheduler.state_dict()} if (scheduler := self.schedulers[key]) else {}),
            }
            for key, module in self.modules.items()
        }

    def start_from(self, state: dict[str, Any]) -> list[str]:
        """Set each module's parameters to those of another run's :meth:`state_dict` ``state`` (a run trained on the
        same training views; its optimiser and schedule states are left out: this run trains its own). Returns the
        keys of the modules left as they were: absent from ``state``, or of other shapes there."""
        kept = []
        for key, module in self.modules.items():
            if key in state and not _shape_mismatch(module, state[key]["module"]):
                module.load_state_dict(state[key]["module"])
            else:
                kept.append(key)
        return kept

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a module whose parameters have other shapes (other training views) is refused."""
        for key, module in self.modules.items():
            if key not in state:
                continue
            mismatch = _shape_mismatch(module, state[key]["module"])
            if mismatch:
                raise InputError(f"the checkpoint's {key} {mismatch}: it was trained on other training views")
            module.load_state_dict(state[key]["module"])
            if self.optimizers[key] is not None:
                load_optimizer_state(self.optimizers[key], state[key]["optimizer"], f"views.{key}.optimizer")
            if self.schedulers[key] is not None and "scheduler" in state[key]:
                self.schedulers[key].load_state_dict(state[key]["scheduler"])


def _shape_mismatch(module: ViewModule, saved: dict[str, Tensor]) -> str | None:
    """What in ``saved`` (a module's state dict) has another shape than ``module``'s own; None: nothing."""
    for name, value in module.state_dict().items():
        if name not in saved:
            return f"has no parameter '{name}'"
        if saved[name].shape != value.shape:
            return f"parameter '{name}' has shape {tuple(saved[name].shape)}, this run's {tuple(value.shape)}"
    return None


def rows_trained_anywhere(module: ViewModule, names: list[str], dist: DistributedContext) -> Tensor | None:
    """The rows [R] of ``module`` that the views ``names`` of this process, or of any other torchrun process,
    train in this step; None: every row."""
    device = next(module.parameters()).device
    rows = module.trained_rows(names, device)
    if rows is None or not dist.enabled:
        return rows
    trained = torch.zeros(len(module.index), device=device)  # [N]: 1 where some process trained the view
    trained[rows] = 1.0
    dist.all_reduce_sum([trained])
    return trained.nonzero().flatten()


def view_entries(resolved: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{key: {name, **options}}`` of the per-view modules a resolved run config turns on."""
    entries = {key: {"name": key, **entry} for key, entry in resolved["views"].items() if entry is not None}
    return {key: entry for key, entry in entries.items() if entry["name"] != "none"}  # a name is its key unless given


def fold_view_section(entry: dict[str, Any], old: dict[str, Any], section: str, source: str) -> dict[str, Any]:
    """The ``views:`` entry ``entry`` of ``section`` with the old shape's section ``old`` (``appearance:``,
    ``pose_opt:``, read for one release) merged in. The two shapes are not layers of each other (a config's layers
    are merged before this reads them): an option both set (``mode`` and ``name`` are one) to different values is
    refused naming both keys.

    Raises:
        ConfigError: an option ``entry`` and ``old`` set to different values.
    """
    written = {("name" if key == "mode" else key): (key, value) for key, value in entry.items()}
    for key, value in old.items():
        new_key, new_value = written.get("name" if key == "mode" else key, (key, value))
        if new_value != value:
            raise ConfigError(
                f"{source}: key '{section}.{key}' ({value!r}) and key 'views.{section}.{new_key}' ({new_value!r}) "
                f"set the same option; write it once, under views.{section} (the old '{section}:' is read until the "
                f"next release)"
            )
    named = any(key in old for key in ("name", "mode"))
    return {**{k: v for k, v in entry.items() if not (named and k in ("name", "mode"))}, **old}


def current_shape(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved run config (a checkpoint's) in the current shape: the old shape's resolved top-level sections
    (:data:`VIEW_SECTIONS`) moved into ``views``."""
    if not any(section in config for section in VIEW_SECTIONS):
        return config
    views = {
        **{section: config[section] for section in VIEW_SECTIONS if section in config},
        **(config.get("views") or {}),
    }
    return {**{k: v for k, v in config.items() if k not in VIEW_SECTIONS}, "views": views}


def export_notes(resolved: dict[str, Any]) -> list[str]:
    """What an export of the Gaussians leaves out of the per-view modules a resolved run config turns on, a line each
    (:attr:`ViewModule.export_note`)."""
    notes = [VIEW_REGISTRY.get(entry["name"]).export_note for entry in view_entries(resolved).values()]
    return [note for note in notes if note]


def build_views(
    resolved: dict[str, Any], train_names: list[str], device: torch.device, source: str = "config"
) -> ViewModules:
    """The per-view modules of a resolved run config for the training views ``train_names``."""
    modules = {}
    for key, entry in view_entries(resolved).items():
        try:
            modules[key] = VIEW_REGISTRY.build(entry, train_names=train_names).to(device)
        except ValueError as exc:
            raise ConfigError(f"{source}: key 'views.{key}': {exc}") from exc
        except (MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            off = f"views.{key}.name=none" if key in VIEW_SECTIONS else f"views.{key}=null"
            raise ConfigError(
                f"{source}: key 'views.{key}': out of memory for its {len(train_names)} training images "
                f"({last_line(exc)}); give it fewer cells or parameters, or turn it off ({off})"
            ) from None
    return ViewModules(modules)
