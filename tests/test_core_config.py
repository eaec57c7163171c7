"""Settings: defaults from the packaged YAML, user overrides, and every value checked by type and range."""

import dataclasses

import pytest

from ditto_fast.core.config import DEFAULT_YAML, Config, default, load_config
from ditto_fast.core.errors import InputError, UsageError


def test_every_setting_has_one_packaged_default():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.motion.steps == 25 and cfg.motion.overlap == 10 and cfg.render.preset == "veryfast"
    for section in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, section.name)):
            assert f.default is dataclasses.MISSING                      # no second copy in the code
            assert getattr(getattr(cfg, section.name), f.name) == default(section.name, f.name)
    assert "smooth_dims" not in DEFAULT_YAML.read_text() and "window: 80" not in DEFAULT_YAML.read_text()


def test_override_and_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("motion:\n  steps: 10\nregister:\n  crop_scale: 2\n")
    cfg = load_config(f)
    assert cfg.motion.steps == 10 and cfg.register.crop_scale == 2.0 and cfg.render.crf == 18
    assert isinstance(cfg.register.crop_scale, float)
    f.write_text("motion:\n  stepz: 10\n")
    with pytest.raises(UsageError, match="unknown setting 'stepz'"):
        load_config(f)
    f.write_text("motion: [1, 2\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(f)
    with pytest.raises(InputError, match="missing.yaml: file not found; give a config file"):    # exit 3
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text,key", [
    ('motion:\n  steps: "25"\n', "motion.steps"),
    ("motion:\n  steps: 2.5\n", "motion.steps"),
    ("motion:\n  steps: true\n", "motion.steps"),
    ("motion:\n  steps: 0\n", "motion.steps"),
    ("motion:\n  overlap: 90\n", "motion.overlap"),
    ("motion:\n  guidance: .nan\n", "motion.guidance"),
    ("render:\n  crf: 52\n", "render.crf"),
    ("render:\n  preset: placebo\n", "render.preset"),
    ("register:\n  crop_scale: null\n", "register.crop_scale"),
    ("colour:\n  blue: 1\n", "unknown section 'colour'"),
    ("motion: 3\n", "motion must be a mapping"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, text, key):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        load_config(f)
    msg = str(e.value)
    assert str(f) in msg and key in msg and "\n" not in msg


def test_cli_refuses_a_bad_config_with_exit_2_and_prints_the_settings(tmp_path, capsys):
    from ditto_fast.cli import main

    f = tmp_path / "bad.yaml"
    f.write_text('motion:\n  steps: "25"\n')
    with pytest.raises(SystemExit) as e:
        main(["render", "--avatar", "a", "--audio", str(tmp_path / "a.wav"), "--config", str(f)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.count("\n") == 0 and "motion.steps" in err and str(f) in err
    f.write_text("render:\n  crf: 20\n")
    main(["config", "--config", str(f)])
    out = capsys.readouterr().out
    assert "crf: 20" in out and "steps: 25" in out
