"""Typed defaults and YAML overrides."""

import pytest

from ditto_fast.config import Config, load_config
from ditto_fast.errors import UsageError


def test_packaged_yaml_equals_the_dataclass_defaults():
    assert load_config() == Config()


def test_override_and_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("motion:\n  steps: 10\nregister:\n  crop_scale: 2.0\n")
    cfg = load_config(f)
    assert cfg.motion.steps == 10 and cfg.register.crop_scale == 2.0 and cfg.render.crf == 18
    f.write_text("motion:\n  stepz: 10\n")
    with pytest.raises(UsageError, match="unknown setting 'stepz'"):
        load_config(f)
    f.write_text("motion: [1, 2\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(f)
    with pytest.raises(UsageError, match="not found"):
        load_config(tmp_path / "missing.yaml")
