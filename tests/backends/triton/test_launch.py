"""The Triton backend's launcher (nkilib_msda/backends/triton/launch.py) with stand-in kernels:
argument order, the direct C-launcher path, its first-launch check against Triton's own launch,
the fallbacks, and the Triton version range. No kernel runs (CPU tensors, fake launchers)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from nkilib_msda.backends.triton import launch as triton_launch  # noqa: E402


@pytest.fixture(autouse=True)
def _fast_launch_in_range(monkeypatch):
    """Direct launches on, a Triton version inside the range, no warning issued yet."""
    monkeypatch.setattr(triton_launch, "FAST_LAUNCH", [True])
    monkeypatch.setattr(triton_launch, "triton_version", lambda: (3, 6))
    monkeypatch.setattr(triton_launch, "_WARNED", set())


class _FakeCompiled:
    """Triton's compiled kernel: ``compiled[grid]`` is its own runner. The "kernel" adds
    ``step`` to its first tensor argument."""

    def __init__(self, log, fail=False, step=1.0):
        self.log, self.fail, self.step = log, fail, step

    def __getitem__(self, grid):
        def runner(*args):
            if self.fail:
                raise TypeError("launcher signature mismatch")
            self.log.append(("direct", grid, args))
            args[0].add_(self.step)
        return runner


class _FakeKernel:
    """Stands in for a @triton.jit function: records JIT launches, returns a fake compiled kernel."""

    arg_names = ["a", "b", "n", "BLOCK", "FLAG"]

    def __init__(self, fail_direct=False):
        self.log = []
        self.compiled = _FakeCompiled(self.log, fail_direct)

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            args[0].add_(self.compiled.step)
            return self.compiled
        return jit


class _FakeCompiledWithLauncher(_FakeCompiled):
    """A compiled kernel with the C launcher's attributes (``run``, ``function``,
    ``packed_metadata``) that Triton's own runner calls; ``bare_step`` is what the C launcher
    adds (a wrong launch when it differs from ``step``)."""

    function, packed_metadata = "cu-function", "packed"

    def __init__(self, log, bare_step=1.0):
        super().__init__(log)
        self.bare_step = bare_step

    def run(self, *args):
        self.log.append(("bare", args))
        args[9].add_(self.bare_step)  # the kernel's first argument follows 9 launch arguments


def _with_c_launcher(monkeypatch, kernel, bare_step=1.0):
    pytest.importorskip("triton.knobs", reason="needs a Triton with knobs (3.4+)")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index,
                        raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    kernel.compiled = _FakeCompiledWithLauncher(kernel.log, bare_step)
    return kernel


def test_launcher_reuses_compiled_kernel_with_all_arguments_in_order():
    kernel = _FakeKernel()
    launch = triton_launch.Launcher(kernel, (6,), (7,), dict(BLOCK=16, FLAG=True, num_warps=4))
    a, b = torch.zeros(4), torch.zeros(4)
    launch(a, b)
    launch(a, b)
    assert [entry[0] for entry in kernel.log] == ["jit", "direct"]
    assert kernel.log[0][3] == dict(BLOCK=16, FLAG=True, num_warps=4)
    _, grid, args = kernel.log[1]
    assert grid == (6, 1, 1) and args[:2] == (a, b) and args[2:] == (7, 16, True)
    launch(a[1:], b)  # another alignment: compiled again through the JIT
    assert kernel.log[-1][0] == "jit"


def test_launcher_falls_back_to_jit_when_direct_launch_fails():
    kernel = _FakeKernel(fail_direct=True)
    launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    a = torch.zeros(4)
    for _ in range(3):
        launch(a, a)
    assert [entry[0] for entry in kernel.log] == ["jit", "jit", "jit"]
    assert torch.equal(a, torch.full((4,), 3.0))  # every call ran once


def test_launcher_calls_the_c_launcher_as_tritons_runner_does(monkeypatch):
    knobs = pytest.importorskip("triton.knobs", reason="triton is an optional dependency (the `gpu` extra)")

    kernel = _with_c_launcher(monkeypatch, _FakeKernel())
    launch = triton_launch.Launcher(kernel, (6, 2), (7,), dict(BLOCK=16, FLAG=True, num_warps=4))
    a, b = torch.zeros(4), torch.zeros(4)
    launch(a, b)
    launch(a, b)  # first direct launch: the C launcher, then Triton's runner on copies
    assert [entry[0] for entry in kernel.log] == ["jit", "bare", "direct"]
    # grid, stream of the current device, function, packed metadata, no launch metadata and
    # no hooks, then the kernel's arguments with the constexpr tail
    assert kernel.log[1][1] == (6, 2, 1, 1003, "cu-function", "packed", None, None, None,
                                a, b, 7, 16, True)
    copies = kernel.log[2][2]
    assert copies[0] is not a and copies[2:] == (7, 16, True)
    launch(a, b)  # checked: the C launcher alone
    assert [entry[0] for entry in kernel.log[3:]] == ["bare"]
    assert torch.equal(a, torch.full((4,), 3.0))
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    launch(a, b)  # a launch hook is set: Triton's runner launches, so the hook sees it
    assert kernel.log[-1] == ("direct", (6, 2, 1), (a, b, 7, 16, True))


def test_a_direct_launch_that_disagrees_on_its_first_call_keeps_tritons_results(monkeypatch):
    kernel = _with_c_launcher(monkeypatch, _FakeKernel(), bare_step=2.0)  # a wrong launch
    launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    a, b = torch.zeros(4), torch.zeros(4)
    launch(a, b)
    with pytest.warns(RuntimeWarning, match="other results than Triton's own launch"):
        launch(a, b)
    assert torch.equal(a, torch.full((4,), 2.0))  # Triton's result, not the direct launch's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch(a, b)  # Triton's runner from now on, no second warning
    assert kernel.log[-1][0] == "direct" and torch.equal(a, torch.full((4,), 3.0))


def test_atomic_arguments_are_compared_to_a_tolerance(monkeypatch):
    # The C launcher adds 1 + 1e-7 (another order of atomic additions): accepted for an
    # argument declared atomic, a mismatch for any other.
    for atomic, expect_warning in (((0,), False), ((), True)):
        monkeypatch.setattr(triton_launch, "_WARNED", set())
        kernel = _with_c_launcher(monkeypatch, _FakeKernel(), bare_step=1.0 + 1e-7)
        launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False),
                                        atomic=atomic)
        a = torch.zeros(4, dtype=torch.float64)
        launch(a, a)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            launch(a, a)
        assert bool(caught) == expect_warning


def test_aliased_arguments_stay_aliased_in_the_check(monkeypatch):
    # The same tensor as two arguments (the backend's unused placeholders): Triton's launch on
    # the copies sees one copy twice, so both launches add once and agree.
    kernel = _with_c_launcher(monkeypatch, _FakeKernel())
    launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    a = torch.zeros(4)
    launch(a, a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch(a, a)
    copies = kernel.log[-1][2]
    assert copies[0] is copies[1] and torch.equal(a, torch.full((4,), 2.0))


def test_nan_results_compare_bitwise(monkeypatch):
    kernel = _with_c_launcher(monkeypatch, _FakeKernel(), bare_step=float("nan"))
    kernel.compiled.step = float("nan")
    launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    a = torch.zeros(4)
    launch(a, a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch(a, a)  # NaN from both launches: the same bits, no mismatch


def test_launcher_falls_back_to_tritons_runner_when_the_c_launcher_rejects_the_call(monkeypatch):
    class RejectingLauncher(_FakeCompiledWithLauncher):
        def run(self, *args):
            raise TypeError("function takes exactly 12 arguments")

    kernel = _with_c_launcher(monkeypatch, _FakeKernel())
    kernel.compiled = RejectingLauncher(kernel.log)
    launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    a = torch.zeros(4)
    for _ in range(4):
        launch(a, a)
    # JIT; the bare launch raises, so the JIT launches again; then Triton's runner for good
    assert [entry[0] for entry in kernel.log] == ["jit", "jit", "direct", "direct"]
    assert torch.equal(a, torch.full((4,), 4.0))


@pytest.mark.parametrize("version", [(3, 3), (3, 10), (4, 0), None])
def test_triton_outside_the_range_launches_through_the_jit_with_one_warning(monkeypatch, version):
    monkeypatch.setattr(triton_launch, "triton_version", lambda: version)
    kernel = _with_c_launcher(monkeypatch, _FakeKernel())
    launch = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    a = torch.zeros(4)
    with pytest.warns(RuntimeWarning, match="outside the versions 3.4-3.9"):
        launch(a, a)
    other = triton_launch.Launcher(kernel, (2,), (3,), dict(BLOCK=8, FLAG=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process
        for _ in range(2):
            launch(a, a)
            other(a, a)
    assert {entry[0] for entry in kernel.log} == {"jit"}


def test_triton_version_parses_major_minor(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.undo()
    monkeypatch.setattr(triton, "__version__", "3.7.1+git1234")
    assert triton_launch.triton_version() == (3, 7)
    monkeypatch.setattr(triton, "__version__", "nightly")
    assert triton_launch.triton_version() is None
