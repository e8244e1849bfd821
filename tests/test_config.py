"""YAML loading, _base_ includes, overrides and validation errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_yaml

from gsrecon.config import ConfigError, load_config, parse_structured
from gsrecon.engine.trainer import DefaultTrainer


def test_base_include_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    write_yaml(tmp_path / "base" / "defaults.yaml", {"max_steps": 100, "seed": 3, "model": {"sh_degree": 2}})
    child = write_yaml(
        tmp_path / "child.yaml",
        {"_base_": "base/defaults.yaml", "seed": 4, "hooks": [{"name": "LogHook", "log_interval": 5}]},
    )
    raw = load_config(child, ["max_steps=200", "model.sh_degree=1", "hooks.LogHook.log_interval=10", "resume=ckpt.pt"])
    cfg = parse_structured(DefaultTrainer.Config, raw, source=str(child))
    assert cfg.max_steps == 200 and isinstance(cfg.max_steps, int)
    assert cfg.seed == 4
    assert cfg.model["sh_degree"] == 1 and cfg.model["name"] == "gaussians"  # merged into the default entry
    assert cfg.hooks["LogHook"]["log_interval"] == 10
    assert cfg.resume == "ckpt.pt"
    assert cfg.data.dataset == "synthetic"  # defaults fill what the files leave out


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "bad.yaml", {"data": {"factr": 2}})
    with pytest.raises(ConfigError, match=r"bad\.yaml.*data\.factr"):
        parse_structured(DefaultTrainer.Config, load_config(path), source=str(path))


def test_wrong_type_names_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "c.yaml", {})
    with pytest.raises(ConfigError, match=r"c\.yaml.*'max_steps'.*abc"):
        parse_structured(DefaultTrainer.Config, load_config(path, ["max_steps=abc"]), source=str(path))


def test_override_of_unknown_nested_key_is_an_error(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "c.yaml", {})
    with pytest.raises(ConfigError, match=r"data\.pathh"):
        parse_structured(DefaultTrainer.Config, load_config(path, ["data.pathh=/x"]), source=str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        ("a: [1, 2", "invalid YAML"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("_base_: self.yaml\n", "circular"),
    ],
)
def test_unreadable_configs(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "self.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_malformed_override(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "c.yaml", {})
    with pytest.raises(ConfigError, match="key=value"):
        load_config(path, ["max_steps"])


def test_hook_arguments_are_validated_against_the_hook_config(make_trainer) -> None:
    with pytest.raises(ConfigError, match=r"hooks\.LogHook\.bogus"):
        make_trainer(hooks=[{"name": "LogHook", "bogus": 1}])
    with pytest.raises(ConfigError, match=r"hooks\.LogHook\.log_interval"):
        make_trainer(hooks=[{"name": "LogHook", "log_interval": "often"}])


def test_unknown_names_list_the_known_ones(make_trainer) -> None:
    with pytest.raises(ConfigError, match=r"hooks\.LogHok.*unknown hook 'LogHok'.*LogHook"):
        make_trainer(hooks=[{"name": "LogHok"}])
    with pytest.raises(ConfigError, match=r"unknown writer 'Tensorboard'.*TensorboardWriter"):
        make_trainer(writers=[{"name": "Tensorboard"}])
    with pytest.raises(ConfigError, match=r"unknown renderer 'cuda'.*torch"):
        make_trainer(renderer={"name": "cuda"})


@pytest.mark.parametrize(
    "top, message",
    [
        ({"max_steps": 0}, "max_steps"),
        ({"val_interval": 0}, "val_interval"),
        ({"device": "tpu"}, "device"),
        ({"hooks": [{"name": "LogHook", "priority": "SOMETIMES"}]}, r"hooks\.LogHook\.priority"),
        ({"hooks": [{"name": "LogHook", "priority": 101}]}, r"hooks\.LogHook\.priority"),
    ],
)
def test_invalid_values(make_trainer, top: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_trainer(**top)


def test_resolved_config_is_written_and_complete(make_trainer) -> None:
    trainer = make_trainer()
    import yaml

    written = yaml.safe_load((trainer.exp_dir / "config.yaml").read_text())
    log_hook = written["hooks"]["LogHook"]
    assert log_hook["ema_factor"] == 0.4  # defaults of each hook are filled in
    assert written["renderer"]["name"] == "torch" and "eps2d" in written["renderer"]
    assert written["data"]["synthetic"]["width"] == 32
    assert "resume" not in written


def test_model_entry_is_validated_and_resolved(make_trainer) -> None:
    with pytest.raises(ConfigError, match=r"model\.sh_degre"):
        make_trainer(model={"sh_degre": 2})
    with pytest.raises(ConfigError, match=r"unknown model 'splats'.*gaussians"):
        make_trainer(model={"name": "splats"})
    trainer = make_trainer(model={"sh_degree": 2})
    assert trainer.resolved_config["model"]["sh_degree"] == 2
    assert trainer.resolved_config["model"]["init_opacity"] == 0.1  # defaults filled in
    assert trainer.model.params["shN"].shape[1] == 8


def test_changing_an_entry_name_drops_the_options_of_the_old_one(tmp_path: Path) -> None:
    write_yaml(
        tmp_path / "base.yaml",
        {"strategy": {"name": "default", "reset_every": 100}, "renderer": {"name": "torch", "alpha_max": 0.99}},
    )
    child = write_yaml(tmp_path / "child.yaml", {"_base_": "base.yaml", "strategy": {"name": "mcmc", "cap_max": 9}})
    raw = load_config(child, ["renderer.name=gsplat"])
    assert raw["strategy"] == {"name": "mcmc", "cap_max": 9}
    assert raw["renderer"] == {"name": "gsplat"}
    same = load_config(child, ["strategy={name: mcmc, noise_lr: 1.0}", "strategy.refine_every=7"])
    assert same["strategy"] == {"name": "mcmc", "cap_max": 9, "noise_lr": 1.0, "refine_every": 7}


def test_a_module_named_as_mode_or_name_replaces_the_one_a_layer_below_named_either_way(tmp_path: Path) -> None:
    base = write_yaml(tmp_path / "base.yaml", {"pose_opt": {"name": "se3", "without_keypoints": "keep"}})
    assert load_config(base, ["pose_opt.mode=none"])["pose_opt"] == {"mode": "none"}
    assert load_config(base, ["pose_opt.mode=se3"])["pose_opt"] == {"without_keypoints": "keep", "mode": "se3"}
    assert load_config(base, ["pose_opt={mode: none}"])["pose_opt"] == {"mode": "none"}
    child = write_yaml(tmp_path / "child.yaml", {"_base_": "base.yaml", "pose_opt": {"mode": "se3", "lr": 0.01}})
    assert load_config(child)["pose_opt"] == {"without_keypoints": "keep", "mode": "se3", "lr": 0.01}
    assert load_config(child, ["pose_opt.name=none"])["pose_opt"] == {"name": "none"}
    both = write_yaml(tmp_path / "both.yaml", {"appearance": {"name": "affine", "mode": "bilateral_grid"}})
    with pytest.raises(ConfigError, match=r"key 'appearance.mode': an alias of appearance.name; give one of them"):
        DefaultTrainer(parse_structured(DefaultTrainer.Config, load_config(both)))


def test_imports_are_relative_to_the_yaml_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    config = write_yaml(tmp_path / "sub" / "c.yaml", {"imports": ["hooks.py", "some.module"]})
    assert load_config(config)["imports"] == [str(tmp_path / "sub" / "hooks.py"), "some.module"]


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\nmodel: {sh_degree: 2\nmax_steps: 3\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: invalid YAML at line \d+, column \d+"):
        load_config(path)


def test_failing_import_file_is_a_config_error_naming_it(tmp_path: Path, make_trainer) -> None:
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("def broken(:\n")
    with pytest.raises(ConfigError, match=r"imports.*bad_plugin\.py failed: line 1"):
        make_trainer(imports=[str(bad)])
    missing_dep = tmp_path / "needs_dep.py"
    missing_dep.write_text("import not_a_real_module_xyz\n")
    with pytest.raises(ConfigError, match=r"needs_dep\.py failed: ModuleNotFoundError"):
        make_trainer("b", imports=[str(missing_dep)])


def test_a_plugin_reader_takes_its_own_options_from_its_section(tmp_path: Path) -> None:
    import dataclasses

    import torch

    from gsrecon.config import to_container
    from gsrecon.data.pipeline import DataPipeline
    from gsrecon.data.readers.synthetic import SyntheticConfig, load_synthetic
    from gsrecon.engine.resolve import resolve_data_config
    from gsrecon.registry import DATASET_REGISTRY

    with DATASET_REGISTRY.scoped():

        @DATASET_REGISTRY.register("few_views")
        class FewViews:
            @dataclasses.dataclass
            class Config:
                views: int = 3

            def __init__(self, cfg: Config) -> None:
                self.cfg = cfg

            def read(self, data: DataPipeline.Config):
                scene = SyntheticConfig(num_views=self.cfg.views, num_points=20, cache_dir=str(tmp_path))
                return load_synthetic(scene, data.factor, "none")

        path = write_yaml(tmp_path / "run.yaml", {"data": {"dataset": "few_views", "few_views": {"views": 2}}})
        cfg = parse_structured(DefaultTrainer.Config, load_config(path), source=str(path))
        assert cfg.data.reader == {"views": 2}
        assert len(DataPipeline(cfg.data, torch.device("cpu")).scene.train) == 2
        assert to_container(cfg.data)["few_views"] == {"views": 2}  # config.yaml writes it back under the name

        typo = parse_structured(DefaultTrainer.Config, load_config(path, ["data.few_views.veiws=2"]), str(path))
        with pytest.raises(ConfigError, match=r"run\.yaml.*'data\.few_views\.veiws'"):
            resolve_data_config(typo.data, str(path))
        # Another reader's section (a base config's, before this one chose its reader) is left out; a section
        # that names no reader is an unknown key.
        other = parse_structured(DefaultTrainer.Config, load_config(path, ["data.synthetic.width=8"]), str(path))
        assert other.data.reader == {"views": 2} and "synthetic" not in to_container(other.data)
        with pytest.raises(ConfigError, match=r"run\.yaml.*data\.synthtic"):
            parse_structured(DefaultTrainer.Config, load_config(path, ["data.synthtic.width=8"]), str(path))


def test_blender_is_another_name_of_the_transforms_reader() -> None:
    from gsrecon.registry import DATASET_REGISTRY

    assert DATASET_REGISTRY.get("blender") is DATASET_REGISTRY.get("transforms")
