"""Every registered backend implements the backend protocol and declares its capabilities, and
dispatch decides from those declarations (and the backend's own answers) only."""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest
import torch

from nkilib_msda import backends
from nkilib_msda.backends.protocol import (
    ANY_DEVICE, BlockAttnResBackend, Capabilities, MsdaBackend, capability_reason)
from nkilib_msda.pytorch import block_attn_res_ops as bar
from nkilib_msda.pytorch import dispatch
from nkilib_msda.validation.msda import (
    FLOAT_DTYPE_NAMES, LOCATION_LAYOUTS, PADDING_MODES, VALUE_LAYOUTS, validate_msda_args)
from _torch_inputs import make_inputs

ALL_BACKENDS = [backends.get_backend(name) for name in backends.BACKEND_NAMES]
IDS = list(backends.BACKEND_NAMES)


@pytest.fixture(autouse=True)
def _fresh_triton_contexts():
    """The triton backend memoizes its support answer per call signature, and some cases here
    set TRITON_INTERPRET: forget those answers on both sides."""
    triton_backend = backends.get_backend("triton")
    triton_backend.clear_contexts()
    yield
    triton_backend.clear_contexts()


def _protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    methods = {}
    for klass in reversed(protocol.__mro__):
        for name, member in vars(klass).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                methods[name] = inspect.signature(member)
    return methods


def _assert_implements(module: types.ModuleType, protocol: type) -> None:
    assert isinstance(module, protocol), (module.__name__, protocol.__name__)
    for name, wanted in _protocol_methods(protocol).items():
        got = inspect.signature(getattr(module, name))
        want_params = [p for p in wanted.parameters.values() if p.name != "self"]
        got_params = list(got.parameters.values())[:len(want_params)]
        assert [p.name for p in got_params] == [p.name for p in want_params], (module.__name__, name)
        assert all(p.default is not inspect.Parameter.empty for p in
                   list(got.parameters.values())[len(want_params):]), (module.__name__, name)


@pytest.mark.parametrize("module", ALL_BACKENDS, ids=IDS)
def test_every_backend_implements_the_protocol_and_declares_its_capabilities(module):
    _assert_implements(module, MsdaBackend)
    assert module.NAME == backends.BACKEND_NAMES[ALL_BACKENDS.index(module)]
    caps = module.CAPABILITIES
    assert isinstance(caps, Capabilities)
    assert caps.dtypes and set(caps.dtypes) <= set(FLOAT_DTYPE_NAMES)
    assert caps.padding_modes and set(caps.padding_modes) <= set(PADDING_MODES)
    assert caps.value_layouts and set(caps.value_layouts) <= set(VALUE_LAYOUTS)
    assert (caps.sampling_locations_layouts
            and set(caps.sampling_locations_layouts) <= set(LOCATION_LAYOUTS))
    assert caps.device_types and all(isinstance(t, str) for t in caps.device_types)
    assert all(caps.takes_device(t) for t in caps.default_for)
    assert isinstance(caps.always_deterministic, bool)
    assert set(caps.block_attn_res_dtypes) <= set(FLOAT_DTYPE_NAMES)
    if caps.block_attn_res:
        _assert_implements(module, BlockAttnResBackend)


def test_block_attn_res_backends_are_the_declared_ones():
    declared = tuple(m.NAME for m in ALL_BACKENDS if m.CAPABILITIES.block_attn_res)
    assert declared == backends.BLOCK_ATTN_RES_BACKENDS == bar.BACKENDS
    assert "triton" not in declared  # there is no Triton Block AttnRes


def test_the_fallback_backend_takes_everything():
    caps = backends.get_backend(backends.FALLBACK_BACKEND).CAPABILITIES
    assert caps.device_types == ANY_DEVICE
    assert set(caps.dtypes) == set(FLOAT_DTYPE_NAMES)
    assert set(caps.padding_modes) == set(PADDING_MODES)


def _problem(inputs, padding_mode="zeros"):
    return validate_msda_args(inputs.value, inputs.spatial_shapes, None,
                              inputs.sampling_locations, inputs.attention_weights, "BLNC", "BQHLP2", False,
                              padding_mode=padding_mode)


def _skip_without_its_package(module) -> None:
    """The triton backend answers "not installed" before anything else without Triton (the
    `gpu` extra, which the CPU quick start does not install)."""
    if module.NAME == "triton":
        pytest.importorskip("triton")


@pytest.mark.parametrize("module", ALL_BACKENDS, ids=IDS)
def test_explicit_choice_is_refused_exactly_outside_the_declared_modes_and_dtypes(
        module, monkeypatch):
    """An undeclared padding mode or dtype is refused with a reason naming it; a declared one
    is not refused for that reason (the backend may still have other limits)."""
    _skip_without_its_package(module)
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets triton take CPU tensors (no launch here)
    caps = module.CAPABILITIES
    for mode in PADDING_MODES:
        inputs = make_inputs(dtype=torch.float32, seed=31)
        problem = _problem(inputs, mode)
        reason = capability_reason(module.NAME, caps, problem, inputs.value, check_device=False)
        if mode in caps.padding_modes:
            assert reason is None, (module.NAME, mode, reason)
            continue
        with pytest.raises(ValueError, match=f"padding_mode={mode!r}"):
            dispatch.select_backend(module.NAME, problem, inputs.value, inputs.sampling_locations)
    for dtype_name in FLOAT_DTYPE_NAMES:
        dtype = getattr(torch, dtype_name)
        inputs = make_inputs(dtype=dtype, seed=32)
        problem = _problem(inputs, caps.padding_modes[0])
        if dtype_name in caps.dtypes:
            assert capability_reason(module.NAME, caps, problem, inputs.value,
                                     check_device=False) is None
            continue
        with pytest.raises(ValueError, match=dtype_name):
            dispatch.select_backend(module.NAME, problem, inputs.value, inputs.sampling_locations)


@pytest.mark.parametrize("module", ALL_BACKENDS, ids=IDS)
def test_a_device_outside_the_declared_ones_is_refused(module):
    _skip_without_its_package(module)
    caps = module.CAPABILITIES
    inputs = make_inputs(dtype=torch.float32, seed=33)
    problem = _problem(inputs, caps.padding_modes[0])
    meta = inputs.value.to("meta")
    reason = module.unsupported_reason(problem, meta, inputs.sampling_locations.to("meta"))
    if caps.takes_device("meta"):
        assert reason is None
    else:
        assert reason is not None and "meta" in reason


@pytest.mark.parametrize("device", ["cpu", "cuda", "xla", "privateuseone", "mps", "meta"])
def test_device_default_is_the_first_backend_declaring_it(device):
    declared = [m.NAME for m in ALL_BACKENDS if device in m.CAPABILITIES.default_for]
    expected = declared[0] if declared else backends.FALLBACK_BACKEND
    assert dispatch.device_default_backend(torch.device(device)) == expected


def test_a_new_backend_is_dispatched_from_its_declarations_alone(monkeypatch):
    """A backend registered with default_for=("xla",) becomes xla's automatic choice, and its
    own unsupported_reason makes the automatic choice fall back, with no change to dispatch."""
    fake = types.ModuleType("fake_backend")
    fake.NAME = "fake"
    fake.CAPABILITIES = Capabilities(device_types=("xla", "cpu"), default_for=("xla",),
                                     dtypes=("float32",), padding_modes=("zeros",))
    fake.is_available = lambda: True
    fake.unsupported_reason = lambda problem, value, loc: capability_reason(
        "fake", fake.CAPABILITIES, problem, value)
    fake.backward_unsupported_reason = lambda problem, value, loc: "no backward"
    fake.msda_forward = fake.msda_backward = lambda *args, **kwargs: None
    assert isinstance(fake, MsdaBackend)
    monkeypatch.setitem(backends._LOADED, "fake", fake)
    monkeypatch.setattr(dispatch, "BACKEND_NAMES", (*backends.BACKEND_NAMES, "fake"))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.device_default_backend(torch.device("xla")) == "fake"
    inputs = make_inputs(dtype=torch.float32, seed=34)
    problem = _problem(inputs)
    assert dispatch.select_backend("fake", problem, inputs.value, inputs.sampling_locations,
                                   needs_backward=False) == "fake"
    with pytest.raises(ValueError, match="no backward"):
        dispatch.select_backend("fake", problem, inputs.value, inputs.sampling_locations)


def test_dispatch_names_no_backend_and_no_device():
    """dispatch.py holds no backend facts: no backend name or device type in its code (its
    docstrings may describe the outcome)."""
    tree = ast.parse(Path(dispatch.__file__).read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    literals = {node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings}
    facts = {*backends.BACKEND_NAMES, "cpu", "cuda", "neuron", "privateuseone", "xla"}
    assert not literals & facts, literals & facts
