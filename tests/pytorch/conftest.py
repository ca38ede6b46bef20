"""Fixtures several torch-layer test files share (the helper modules of this folder,
``_torch_inputs`` and the like, are put on ``sys.path`` by the root conftest.py)."""

import pytest


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
