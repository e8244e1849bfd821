"""Hook registry, priorities, custom hook points, errors naming hooks, user hooks through `imports:`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from gsrecon.engine.trainer import HookError
from gsrecon.hooks import Hook, Priority, get_priority
from gsrecon.registry import Registry, RegistryError

CALLS: list[str] = []


class RecordingHook(Hook):
    """Appends its tag to CALLS at each hook point it sees (test helper)."""

    @dataclass
    class Config:
        tag: str = ""

    def __init__(self, cfg: Config) -> None:
        self.tag = cfg.tag

    def before_train_iter(self, trainer) -> None:
        CALLS.append(self.tag)

    def my_point(self, trainer, value: int) -> None:
        CALLS.append(f"{self.tag}:{value}")


class FailingHook(Hook):
    def after_train_iter(self, trainer) -> None:
        raise RuntimeError("boom")


@pytest.fixture(autouse=True)
def _register_test_hooks(hook_registry) -> None:
    for cls in (
        RecordingHook,
        FailingHook,
    ):
        hook_registry.register()(cls)


def test_registry_basics() -> None:
    registry: Registry = Registry("thing")

    @registry.register()
    class A:
        def __init__(self, x: int = 1) -> None:
            self.x = x

    assert registry.get("A") is A
    assert registry.build({"name": "A", "x": 3}).x == 3
    with pytest.raises(RegistryError, match="already has an entry named 'A'"):
        registry.register()(A)
    with pytest.raises(RegistryError, match="unknown thing 'B'; known things: A"):
        registry.get("B")


def test_scoped_registry_forgets_what_was_registered_inside() -> None:
    registry: Registry = Registry("thing")

    @registry.register()
    class Kept:
        pass

    with registry.scoped():
        registry.register()(type("Temporary", (), {}))
        assert "Temporary" in registry
    assert registry.names() == ["Kept"]


def test_priority_names_and_ints() -> None:
    assert get_priority("HIGHEST") == 0 and get_priority("lowest") == 100
    assert get_priority(Priority.BELOW_NORMAL) == 60 and get_priority(42) == 42
    for bad in ("MEDIUM", -1, 101, 2.5, True):
        with pytest.raises(ValueError):
            get_priority(bad)


def test_hooks_run_in_priority_order_and_equal_priorities_keep_yaml_order(make_trainer) -> None:
    CALLS.clear()
    hooks = [
        {"name": "RecordingHook", "tag": "low", "priority": "LOW"},
        {"name": "RecordingHook", "tag": "normal1"},
        {"name": "RecordingHook", "tag": "high", "priority": "HIGH"},
        {"name": "RecordingHook", "tag": "normal2", "priority": 50},
        {"name": "RecordingHook", "tag": "first", "priority": 0},
    ]
    trainer = make_trainer(hooks=hooks, max_steps=1)
    trainer.train()
    assert CALLS == ["first", "high", "normal1", "normal2", "low"]


def test_custom_hook_points_reach_hooks_that_define_them(make_trainer) -> None:
    CALLS.clear()
    trainer = make_trainer(
        hooks=[
            {"name": "RecordingHook", "tag": "a"},
            {"name": "LogHook", "progress": False},
            {"name": "RecordingHook", "tag": "b", "priority": "HIGH"},
        ]
    )
    trainer.call_hook("my_point", value=7)
    assert CALLS == ["b:7", "a:7"]


def test_exception_in_hook_names_the_hook_and_keeps_the_cause(make_trainer) -> None:
    trainer = make_trainer(hooks=[{"name": "FailingHook"}, {"name": "CheckPointHook", "interval": 1}])
    with pytest.raises(HookError, match=r"FailingHook\.after_train_iter: boom") as info:
        trainer.train()
    assert isinstance(info.value.__cause__, RuntimeError)
    assert trainer.failed
    # The failing step's model is never saved: no checkpoint exists at all.
    assert not list((trainer.exp_dir / "checkpoints").glob("*.pt"))


def test_user_hook_registered_from_a_file_through_imports(make_trainer, tmp_path: Path) -> None:
    plugin = tmp_path / "my_hooks.py"
    plugin.write_text(
        "from gsrecon.hooks import Hook\n"
        "from gsrecon.registry import HOOK_REGISTRY\n\n"
        "@HOOK_REGISTRY.register()\n"
        "class CountStepsHook(Hook):\n"
        "    def __init__(self, filename='steps.txt'):\n"
        "        self.filename, self.steps = filename, 0\n"
        "    def after_train_iter(self, trainer):\n"
        "        self.steps += 1\n"
        "    def after_train(self, trainer):\n"
        "        (trainer.exp_dir / self.filename).write_text(str(self.steps))\n"
    )
    trainer = make_trainer(imports=[str(plugin)], max_steps=4, hooks=[{"name": "CountStepsHook", "filename": "n.txt"}])
    trainer.train()
    assert (trainer.exp_dir / "n.txt").read_text() == "4"
    with pytest.raises(ValueError, match="unexpected keyword argument 'nope'"):
        make_trainer("other", imports=[str(plugin)], hooks=[{"name": "CountStepsHook", "nope": 1}])


@pytest.fixture(scope="module")
def shared_plugin(tmp_path_factory) -> Path:
    """One plugin file that two tests import through ``imports:``, as two tests of the suite import a script."""
    plugin = tmp_path_factory.mktemp("plugin") / "shared_hooks.py"
    plugin.write_text(
        "from gsrecon.hooks import Hook\n"
        "from gsrecon.registry import HOOK_REGISTRY\n\n"
        "@HOOK_REGISTRY.register()\n"
        "class SharedPluginHook(Hook):\n"
        "    pass\n"
    )
    return plugin


@pytest.mark.parametrize("turn", ["first", "second"])
def test_a_plugin_file_registers_its_hooks_in_every_test_that_imports_it(make_trainer, shared_plugin, turn) -> None:
    """The registry is scoped to a test, so the plugin is imported afresh by the next test that names it."""
    trainer = make_trainer(turn, imports=[str(shared_plugin)], max_steps=1, hooks=[{"name": "SharedPluginHook"}])
    assert [type(hook).__name__ for hook in trainer.hooks.values()] == ["SharedPluginHook"]


def test_missing_import_is_a_config_error(make_trainer) -> None:
    with pytest.raises(ValueError, match=r"imports.*not_a_module_xyz"):
        make_trainer(imports=["not_a_module_xyz"])


def test_removing_a_hook_removes_only_its_outputs(make_trainer) -> None:
    without_metrics = make_trainer("nometrics", hooks=[{"name": "CheckPointHook", "interval": 3}])
    without_metrics.train()
    assert not (without_metrics.exp_dir / "metrics.json").exists()
    assert (without_metrics.exp_dir / "checkpoints" / "last.pt").exists()
    assert without_metrics.val_metrics["psnr"] > 0  # validation itself still ran

    without_ckpt = make_trainer("nockpt", hooks=[{"name": "MetricsHook"}, {"name": "ExportHook"}])
    without_ckpt.train()
    assert (without_ckpt.exp_dir / "metrics.json").exists()
    assert (without_ckpt.exp_dir / "point_cloud.ply").exists()
    assert not (without_ckpt.exp_dir / "checkpoints").exists()

    without_export = make_trainer("noexport", hooks=[{"name": "CheckPointHook"}])
    without_export.train()
    assert (without_export.exp_dir / "checkpoints" / "last.pt").exists()
    assert not (without_export.exp_dir / "point_cloud.ply").exists()


def test_the_trainer_gives_hooks_everything_their_view_names(make_trainer) -> None:
    import inspect

    from gsrecon.engine.hook import TrainerView

    trainer = make_trainer()
    members = set(TrainerView.__annotations__) | {
        name for name, _ in inspect.getmembers(TrainerView) if not name.startswith("_")
    }
    assert members >= {"step", "model", "render", "request_stop", "is_main", "resolved_config"}
    assert [name for name in sorted(members) if not hasattr(trainer, name)] == []
