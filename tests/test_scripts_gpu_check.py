"""Parts of the GPU check that need no bundle: the engine processes get only the carried packages this Python lacks
(on PYTHONPATH they would come before its own), and an arm that would overrun the budget is skipped and named. The
whole check runs as a CPU dry run in test_scripts_gpu_bundle.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "gpu"))

import gpu_check  # noqa: E402


def test_the_engine_processes_get_only_what_this_python_lacks(tmp_path):
    site = tmp_path / "site"
    for d in ("click", "no_such_module_61", "no_such_module_61-1.0.dist-info", "soxr_like-0.5.dist-info",
              "__pycache__"):
        (site / d).mkdir(parents=True)
    (site / "threadpoolctl.py").write_text("")
    (site / "other_missing_61.py").write_text("")
    gpu_check.lacking(site, tmp_path / "child")
    linked = sorted(p.name for p in (tmp_path / "child").iterdir())
    assert linked == ["no_such_module_61", "no_such_module_61-1.0.dist-info", "other_missing_61.py",
                      "soxr_like-0.5.dist-info"]
    assert all((tmp_path / "child" / n).resolve() == (site / n).resolve() for n in linked)


def test_an_arm_past_the_budget_is_skipped_and_named(capsys):
    budget = gpu_check.Budget(60.0, time.perf_counter() - 30.0)
    assert budget.fits(20, "a short arm") and not budget.fits(45, "live overlap 78")
    assert budget.skipped == ["live overlap 78"] and "skipped (about 45 s needed" in capsys.readouterr().out
