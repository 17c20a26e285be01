"""Arrays in and out of the engine: torch tensors when the caller uses torch, numpy arrays otherwise."""

import numpy as np

from . import _checks

try:  # torch is optional: without it every result is a numpy array
    import torch
except ImportError:  # pragma: no cover - exercised only where torch is missing
    torch = None


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x, name, dtype=None):
    """x (torch tensor, numpy array, nested list) as a numpy array; TypeError naming `name` otherwise. To an
    integer dtype only from integers that fit it (ValueError naming `name` and the range otherwise)."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    elif not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except (ValueError, TypeError) as e:
            raise TypeError(f"{name}: expected a tensor, an array or a list of ints ({e})") from None
    if dtype is not None and x.dtype != dtype:
        if np.dtype(dtype).kind in "iu":  # refuse what the cast would wrap (10**12 into int32), not wrap it
            info = np.iinfo(dtype)
            x = _checks.int_array(name, x, int(info.min), int(info.max))
        x = x.astype(dtype)
    return x


def wrap(array, like_torch):
    """numpy `array` as a torch tensor (sharing memory, ints as int64) when like_torch, else as is."""
    if not like_torch:
        return array
    if array.dtype.kind in "iu":
        array = array.astype(np.int64, copy=False)
    return torch.from_numpy(np.ascontiguousarray(array))


def want_torch(return_tensors):
    """Whether return_tensors asks for torch tensors ("pt"), numpy ("np") or Python lists (None)."""
    if return_tensors in (None, "np"):
        return False
    if return_tensors == "pt":
        if torch is None:
            raise ValueError("return_tensors='pt' needs torch, which is not installed; use return_tensors='np'")
        return True
    raise ValueError(f"return_tensors: {return_tensors!r} is not one of 'pt', 'np' or None")
