"""Backend selection and argument validation of the functional API."""

from __future__ import annotations

import pytest
import torch

import nkilib_msda
from nkilib_msda.backends import BackendUnavailableError, get_backend, nki_backend
from nkilib_msda.backends.reference import backend as reference_torch
from nkilib_msda.pytorch import dispatch
from nkilib_msda.validation.msda import validate_msda_args
from _torch_inputs import make_inputs

MSDA = nkilib_msda.multi_scale_deformable_attention


@pytest.fixture
def no_kernel_work(monkeypatch):
    """Fail the test if any backend starts computing."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a backend ran although the arguments were invalid")

    for module in (reference_torch, nki_backend):
        monkeypatch.setattr(module, "msda_forward", forbidden)
        monkeypatch.setattr(module, "msda_backward", forbidden)


def _call(inputs, **overrides):
    kwargs = dict(value=inputs.value, spatial_shapes=inputs.spatial_shapes, level_start_index=None,
                  sampling_locations=inputs.sampling_locations,
                  attention_weights=inputs.attention_weights)
    options = {k: overrides.pop(k) for k in list(overrides)
               if k in ("value_layout", "sampling_locations_layout", "align_corners",
                        "padding_mode", "backend")}
    kwargs.update(overrides)
    return MSDA(kwargs["value"], kwargs["spatial_shapes"], kwargs["level_start_index"],
                kwargs["sampling_locations"], kwargs["attention_weights"], **options)


INVALID = [
    (dict(value=torch.zeros(2, 30, 2, 4, dtype=torch.float64)), ValueError, "value"),
    (dict(value=torch.zeros(2, 31, 2, dtype=torch.float64)), ValueError, "value"),
    (dict(value=torch.zeros(2, 31, 2, 4, dtype=torch.int32)), TypeError, "value"),
    (dict(value=[[1.0]]), TypeError, "value"),
    (dict(spatial_shapes=((4, 6), (3, 2))), ValueError, "value"),
    (dict(spatial_shapes=((4, 6), (3, 2), (1, 1), (1, 1))), ValueError, "value"),
    (dict(spatial_shapes=((4, 6), (3, -2), (1, 1))), ValueError, "spatial_shapes"),
    (dict(spatial_shapes=torch.tensor([[4.0, 6.0], [3.0, 2.0], [1.0, 1.0]])), TypeError, "spatial_shapes"),
    (dict(level_start_index=(0, 24, 29)), ValueError, "level_start_index"),
    (dict(sampling_locations=torch.zeros(2, 5, 2, 3, 2, 3, dtype=torch.float64)), ValueError, "sampling_locations"),
    (dict(attention_weights=torch.zeros(2, 5, 2, 3, 3, dtype=torch.float64)), ValueError, "attention_weights"),
    (dict(value_layout="BHLC"), ValueError, "value_layout"),
    (dict(sampling_locations_layout="BQHLP"), ValueError, "sampling_locations_layout"),
    (dict(padding_mode="wrap"), ValueError, "padding_mode"),
    (dict(align_corners="yes"), TypeError, "align_corners"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(backend=3), TypeError, "backend"),
    (dict(backend="nki", padding_mode="reflection"), ValueError, "padding_mode='reflection'"),
    (dict(backend="nki", value=torch.zeros(2, 31, 2, 4, dtype=torch.float64)), ValueError, "float64"),
]


@pytest.mark.parametrize("overrides,error,name", INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_invalid_arguments_raise_before_kernel_work(no_kernel_work, overrides, error, name):
    inputs = make_inputs()
    with pytest.raises(error) as info:
        _call(inputs, **dict(overrides))
    assert name in str(info.value)


def test_attention_weights_on_another_device_is_rejected(no_kernel_work):
    inputs = make_inputs()
    with pytest.raises(ValueError, match="attention_weights"):
        _call(inputs, attention_weights=inputs.attention_weights.to("meta"))


def test_env_var_selects_backend_and_argument_wins(monkeypatch):
    inputs = make_inputs()
    problem = validate_msda_args(inputs.value, inputs.spatial_shapes, None,
                                 inputs.sampling_locations, inputs.attention_weights, "BLNC", "BQHLP2", False, "zeros")
    cpu = inputs.value
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.select_backend(None, problem, cpu, inputs.sampling_locations) == "reference"
    monkeypatch.setenv(dispatch.ENV_VAR, "nki")
    assert dispatch.requested_backend(None, cpu.device) == dispatch.BackendChoice("nki", dispatch.ENV_VAR)
    assert dispatch.requested_backend("reference", cpu.device).name == "reference"
    monkeypatch.setenv(dispatch.ENV_VAR, "bogus")
    with pytest.raises(ValueError, match=dispatch.ENV_VAR):
        dispatch.requested_backend(None, cpu.device)
    monkeypatch.setenv(dispatch.ENV_VAR, "auto")
    assert dispatch.requested_backend(None, cpu.device).source == "device"


def test_env_var_choice_is_explicit_and_raises_when_unsupported(monkeypatch, no_kernel_work):
    monkeypatch.setenv(dispatch.ENV_VAR, "nki")
    with pytest.raises(ValueError, match=f"from the {dispatch.ENV_VAR}"):
        _call(make_inputs(), padding_mode="reflection")


@pytest.mark.parametrize("device,expected", [("cpu", "reference"), ("cuda", "triton"),
                                             ("xla", "reference"), ("privateuseone", "nki")])
def test_device_defaults(device, expected):
    assert dispatch.device_default_backend(torch.device(device)) == expected


def test_auto_falls_back_to_reference_when_device_backend_cannot_run(monkeypatch):
    inputs = make_inputs()
    problem = validate_msda_args(inputs.value, inputs.spatial_shapes, None,
                                 inputs.sampling_locations, inputs.attention_weights, "BLNC", "BQHLP2", False,
                                 padding_mode="reflection")
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "device_default_backend", lambda device: "nki")
    assert dispatch.select_backend(None, problem, inputs.value, inputs.sampling_locations) == "reference"
    with pytest.raises(ValueError, match="padding_mode='reflection'"):
        dispatch.select_backend("nki", problem, inputs.value, inputs.sampling_locations)


def test_unavailable_backend_raises_clear_error(monkeypatch):
    inputs = make_inputs()
    monkeypatch.setattr(reference_torch, "is_available", lambda: False)
    with pytest.raises(BackendUnavailableError, match="not available"):
        _call(inputs, backend="reference")


def test_spatial_shapes_and_level_starts_accept_tensors_and_lists():
    inputs = make_inputs()
    expect = _call(inputs, backend="reference")
    shapes = torch.tensor(inputs.spatial_shapes, dtype=torch.int64)
    got = MSDA(inputs.value, shapes, torch.tensor([0, 24, 30]), inputs.sampling_locations,
               inputs.attention_weights)
    assert torch.equal(got, expect)
    got = MSDA(inputs.value, [list(p) for p in inputs.spatial_shapes], [0, 24, 30],
               inputs.sampling_locations, inputs.attention_weights)
    assert torch.equal(got, expect)


def test_get_backend_rejects_unknown_names():
    with pytest.raises(ValueError, match="backend"):
        get_backend("cpu")


@pytest.mark.parametrize("compiled_op_path", [False, True])
def test_deterministic_argument_reaches_the_backend_backward(monkeypatch, compiled_op_path):
    """`deterministic=` travels through the eager path and through the registered operators."""
    import torch

    import nkilib_msda
    from nkilib_msda.backends.reference import backend as reference_torch

    seen = []
    original = reference_torch.msda_backward

    def spy(*args, deterministic=None, **kwargs):
        seen.append(deterministic)
        return original(*args, deterministic=deterministic, **kwargs)

    monkeypatch.setattr(reference_torch, "msda_backward", spy)
    shapes = ((3, 4), (2, 2))
    value = torch.randn(1, 16, 2, 8, dtype=torch.float64, requires_grad=True)
    loc = torch.rand(1, 5, 2, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    attn = torch.rand(1, 5, 2, 2, 3, dtype=torch.float64, requires_grad=True)

    def run(v, l, a):
        return nkilib_msda.multi_scale_deformable_attention(v, shapes, None, l, a, backend="reference",
                                                           deterministic=True)

    fn = torch.compile(run, backend="aot_eager", fullgraph=True) if compiled_op_path else run
    fn(value, loc, attn).sum().backward()
    assert seen == [True]
    first = value.grad.clone()
    value.grad = None
    fn(value, loc, attn).sum().backward()
    assert torch.equal(first, value.grad)


def test_backend_unavailable_error_is_a_value_error():
    # docs/api.md: every error a caller's arguments or environment can cause is a ValueError /
    # TypeError (or a documented subclass)
    assert issubclass(BackendUnavailableError, ValueError)
    assert issubclass(BackendUnavailableError, RuntimeError)  # what it was before
