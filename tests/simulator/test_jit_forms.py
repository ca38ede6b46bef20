"""``nki.jit`` forms of NKI 0.7/0.8 and kernels returning several outputs.

Pages: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.jit.html
(``nki.jit(func=None, mode='auto', **kwargs)``, mode "jax" / "torchxla" / "auto"),
https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/api/generated/nki.jit.html
(``nki.jit(fn=None, *, compile_config=None, specialization_config=None, **kwargs)``),
https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/api/nki.compiler.html
(``CompileConfig``, ``SpecializationConfig``), and
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/nki.execute.html
(returns "the kernel's return value").
"""

import numpy as np

from nkilib_msda.simulator import NkiError, nisa, nki, nl, simulate

from _core_helpers import raises_rule
from _isa_helpers import load, store


def _double(a):
    t = load(a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    return t


def test_jit_options_do_not_change_results():
    cfg = nki.compiler.CompileConfig(non_ssa_legalization=True, dead_code_elim=False)
    spec = nki.compiler.SpecializationConfig(allow_nested_config_override=True)

    @nki.jit(mode="auto", debug_kernel=True, show_compiler_tb=True, experimental_flags="x",
             compile_config=cfg, specialization_config=spec)
    def kernel(a):
        return store(_double(a))

    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(kernel(x), 2 * x)
    assert cfg.non_ssa_legalization is True and "CompileConfig(" in repr(cfg)


def test_jit_option_rules():
    with raises_rule("nki.jit", "mode"):
        nki.jit(mode="baremetal")
    with raises_rule("nki.jit", "compile_config"):
        nki.jit(compile_config={"dead_code_elim": True})
    with raises_rule("nki.compiler.CompileConfig", "unknown option"):
        nki.compiler.CompileConfig(no_such_option=1)


def test_kernel_returning_a_list_gives_a_list():
    @nki.jit
    def kernel(a, b):
        return [store(_double(a)), store(load(b))]

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((2, 4, 3)).astype(np.float32)
    out = kernel(x, y)
    assert isinstance(out, list) and len(out) == 2
    np.testing.assert_array_equal(out[0], 2 * x)
    np.testing.assert_array_equal(out[1], y)
    out2, report = simulate(kernel, lnc=2, report=True)(x, y)
    assert isinstance(out2, list)
    np.testing.assert_array_equal(out2[0], 2 * x)


def test_list_entries_must_still_be_shared_hbm_tensors():
    @nki.jit
    def kernel(a):
        return [store(load(a)), 3]

    try:
        kernel(np.ones((2, 2), np.float32))
    except NkiError as exc:
        assert str(exc).startswith("kernel return: output type")
    else:
        raise AssertionError("a list with a non-tensor entry must be rejected")
