"""Make the helper modules of this directory (``_torch_inputs``, ``_torch_ddp_worker``)
importable whatever pytest's import mode (spawned DDP workers inherit ``sys.path``), and the
fixtures several torch-layer test files share."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def msda_counts(monkeypatch):
    """{'validate': full validations, 'select': backend selections} of the MSDA torch layer."""
    from nkilib_msda.pytorch import dispatch, problem_cache

    calls = {"validate": 0, "select": 0}
    real_select, real_validate = dispatch.select_backend, problem_cache._validate

    def counting_select(*args, **kwargs):
        calls["select"] += 1
        return real_select(*args, **kwargs)

    def counting_validate(*args, **kwargs):
        calls["validate"] += 1
        return real_validate(*args, **kwargs)

    monkeypatch.setattr(dispatch, "select_backend", counting_select)
    monkeypatch.setattr(problem_cache, "_validate", counting_validate)
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    problem_cache.clear_problem_cache()
    yield calls
    problem_cache.clear_problem_cache()
