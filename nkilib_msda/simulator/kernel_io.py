"""Kernel arguments and outputs of an emulator run: caller values (NumPy arrays, torch tensors,
scalars, dataclasses) become HBM tensors, and the tensors a kernel returns become arrays again
(used by jit.py)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from typing import Any, Callable

import numpy as np

from nkilib_msda.simulator.access import read
from nkilib_msda.simulator.dtypes import to_nki_dtype
from nkilib_msda.simulator.errors import NkiError, argument_error, nki_error
from nkilib_msda.simulator.tensor import NkiTensor, Storage
from nkilib_msda.validation.arrays import to_numpy, to_torch

__all__ = ["KernelInputs", "check_signature", "flatten_outputs", "output_to_numpy", "same_output",
           "to_torch"]

class KernelInputs:
    """Turns caller arguments into kernel arguments; remembers arrays for write-back."""

    def __init__(self) -> None:
        self.by_id: dict[int, tuple[np.ndarray, Storage, NkiTensor]] = {}
        self.torch_in = False
        self.torch_back: list[tuple[Any, np.ndarray]] = []

    def _torch(self, value: Any, where: str) -> NkiTensor:
        """A CPU torch tensor becomes a NumPy array (bf16 via ml_dtypes); written back after."""
        t = value.detach()
        if t.device.type != "cpu":
            raise nki_error("kernel arguments", "argument device",
                            f"{where} is a torch tensor on {t.device}; the emulator takes CPU tensors")
        arr = to_numpy(t)
        tensor = self._array(arr, where)
        self.torch_back.append((value, arr))
        return tensor

    def convert(self, value: Any, where: str) -> Any:
        if isinstance(value, np.ndarray):
            return self._array(value, where)
        if isinstance(value, list):
            raise nki_error("kernel arguments", "list argument",
                            f"{where} is a list; lists are rejected since NKI 0.3, pass a tuple")
        if isinstance(value, tuple):
            return tuple(self.convert(v, f"{where}[{i}]") for i, v in enumerate(value))
        if value is None or isinstance(value, (bool, int, float, str, enum.Enum)):
            return value
        if isinstance(value, (np.integer, np.floating, np.bool_)):
            return value.item()
        if isinstance(value, NkiTensor):
            raise nki_error("kernel arguments", "argument type",
                            f"{where} is an NkiTensor from another run; pass NumPy arrays")
        from nkilib_msda.simulator.language import NKIObject

        if isinstance(value, NKIObject):
            return value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            if not type(value).__dataclass_params__.frozen:  # type: ignore[attr-defined]
                raise nki_error("kernel arguments", "argument type",
                                f"{where} is a non-frozen dataclass; kernels must be pure, use "
                                "@dataclass(frozen=True) or nl.NKIObject")
            return value
        if _is_torch_tensor(value):
            self.torch_in = True
            return self._torch(value, where)
        raise nki_error("kernel arguments", "argument type",
                        f"{where} has unsupported type {type(value).__name__}; kernels take "
                        "NumPy arrays, int/float/bool/str/None, tuples, Enums, nl.NKIObject "
                        "and frozen dataclasses")

    def _array(self, arr: np.ndarray, where: str) -> NkiTensor:
        known = self.by_id.get(id(arr))
        if known is not None:
            return known[2]
        try:
            dt = to_nki_dtype(arr.dtype)
        except NkiError as exc:
            hint = (" (its integers have at most 32 bits); where the kernel takes Python ints "
                    "pass a tuple (MSDA's spatial_shapes: a tuple of (H, W) pairs), else an "
                    "int32 array" if arr.dtype.kind in "iu" else "")
            raise argument_error("unsupported dtype",
                                 f"{where} has dtype {arr.dtype}, which NKI does not have"
                                 f"{hint}") from exc
        if arr.size == 0:
            raise argument_error("empty tensor",
                                 f"{where} has shape {arr.shape}; NKI tensors hold at least one "
                                 "element")
        shape = arr.shape if arr.ndim else (1,)
        storage = Storage("shared_hbm", arr.size * dt.itemsize, name=where)
        flat = np.ascontiguousarray(arr).reshape(-1)
        if dt.np != flat.dtype:  # bool -> uint8 0/1
            flat = flat.astype(dt.np)
        storage.data.view(dt.np)[: flat.size] = flat
        storage.init[: storage.nbytes] = 1
        storage.fully_initialised = True
        tensor = NkiTensor(storage, dt, shape, name=where)
        self.by_id[id(arr)] = (arr, storage, tensor)
        return tensor

    def write_back(self) -> None:
        for arr, storage, tensor in self.by_id.values():
            if not storage.written:
                continue
            values = storage.data.view(tensor.dtype.np)[: tensor.size]
            if arr.dtype != values.dtype:
                values = values.astype(arr.dtype)
            if not arr.flags.writeable:
                raise nki_error("simulate", "write-back",
                                f"the kernel wrote input {tensor.name} but the array is read-only")
            arr[...] = values.reshape(arr.shape)
        for original, arr in self.torch_back:
            if self.by_id[id(arr)][1].written:
                with _torch_no_grad():
                    original.copy_(to_torch(arr))


def _is_torch_tensor(value: Any) -> bool:
    module = type(value).__module__
    if not module.startswith("torch"):
        return False
    import torch

    return isinstance(value, torch.Tensor)


def _torch_no_grad() -> Any:
    import torch

    return torch.no_grad()


def check_signature(func: Callable[..., Any]) -> inspect.Signature:
    sig = inspect.signature(func)
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            raise nki_error("nki.jit", "kernel signature",
                            f"parameter {p.name!r} of {func.__qualname__}: NKI kernels may not use "
                            "*args, **kwargs or keyword-only ('*') parameters")
    return sig


def flatten_outputs(result: Any, program: int) -> tuple[list[NkiTensor], bool, bool]:
    """(tensors, is_tuple, is_none); every returned tensor must be in shared_hbm."""
    if result is None:
        return [], False, True
    # a list is returned as a list (nki/api/generated/nki.execute.html: "the kernel's return
    # value"; nki-library's kernels return lists of outputs)
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    for i, t in enumerate(items):
        if not isinstance(t, NkiTensor):
            raise nki_error("kernel return", "output type",
                            f"program {program} returned {type(t).__name__} at position {i}; "
                            "kernels return shared_hbm tensors")
        if t.buffer != "shared_hbm":
            raise nki_error("kernel return", "output buffer",
                            f"output {i} ({t.name or 'unnamed'}) is in {t.buffer}; returned tensors "
                            "must be allocated in nl.shared_hbm")
    return items, isinstance(result, (tuple, list)), False


def output_to_numpy(t: NkiTensor, index: int) -> np.ndarray:
    try:
        values = read(t, "kernel return")
    except NkiError as exc:
        raise nki_error("kernel return", "output not written",
                        f"output {index} ({t.name or 'unnamed'}): {exc}") from None
    if str(t.dtype) == "bool_":
        values = values.astype(np.bool_)
    return values  # read() returns a new array


def same_output(a: NkiTensor, b: NkiTensor) -> bool:
    return (a.storage is b.storage and a.shape == b.shape and a.strides == b.strides
            and a.offset == b.offset and a.dtype == b.dtype)
