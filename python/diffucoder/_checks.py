"""Argument checks of the public API: a wrong type is a TypeError, a value out of range a ValueError, and
every message starts with the argument's name and gives the range. The engine's own checks stay behind
these; these catch what would otherwise reach it wrapped (an int past int32), as a raw pybind11 error, or
not at all (a negative token id)."""

import math
import numbers
import os

import numpy as np

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the engine's float settings are float32


def _describe(value):
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def integer(name, value, lo=INT64_MIN, hi=INT64_MAX, none_ok=False):
    """value as an int in [lo, hi]; bool is not an int here."""
    if value is None and none_ok:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: expected an int{' or None' if none_ok else ''}, got {_describe(value)}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name}: must be an integer in [{lo}, {hi}], got {value}")
    return value


def real(name, value, lo=-FLOAT32_MAX, hi=FLOAT32_MAX, lo_open=False, hi_open=False, none_ok=False):
    """value as a finite float in [lo, hi] (an end excluded when *_open); NaN and inf are refused."""
    if value is None and none_ok:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a float{' or None' if none_ok else ''}, got {_describe(value)}")
    value = float(value)
    too_low = value <= lo if lo_open else value < lo
    too_high = value >= hi if hi_open else value > hi
    if not math.isfinite(value) or too_low or too_high:
        if lo == -FLOAT32_MAX and hi == FLOAT32_MAX:
            bounds = "(a float32)"
        elif hi == FLOAT32_MAX:
            bounds = f"{'>' if lo_open else '>='} {lo:g} (a float32)"
        else:
            bounds = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name}: must be a finite number {bounds}, got {value!r}")
    return value


def boolean(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool (True or False), got {_describe(value)}")
    return bool(value)


def string(name, value, choices=None, none_ok=False):
    if value is None and none_ok:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str{' or None' if none_ok else ''}, got {_describe(value)}")
    if choices is not None and value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(repr(c) for c in choices)}")
    return value


def path(name, value):
    """A str or os.PathLike as a str."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path (str or os.PathLike), got {_describe(value)}")
    value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str path, got {_describe(value)}")
    return value


def int_array(name, array, lo, hi, what="value", range_text=None):
    """array (a numpy array from _arrays.to_numpy) checked to hold integers in [lo, hi], before any cast that
    could wrap them; ValueError naming the first one outside with its index."""
    if array.dtype == object:  # Python ints numpy could not fit in int64, or things that are not ints
        flat = array.reshape(-1)
        for i, v in enumerate(flat):
            integer(f"{name}[{i}]" if array.ndim <= 1 else f"{name} (flat index {i})", v, lo, hi)
        return array.astype(np.int64)
    if array.dtype.kind not in "iub":
        raise TypeError(f"{name}: expected integers, got an array of {array.dtype}")
    if array.size:
        if array.dtype.kind == "u":  # uint64 against Python ints would compare as float64
            outside = array > np.uint64(hi) if hi >= 0 else np.ones(array.shape, dtype=bool)
            if lo > 0:
                outside |= array < np.uint64(lo)
        else:
            outside = (array < max(lo, INT64_MIN)) | (array > min(hi, INT64_MAX))
        bad = np.flatnonzero(outside)
        if bad.size:
            index = np.unravel_index(bad[0], array.shape)
            where = index[0] if array.ndim == 1 else tuple(int(i) for i in index)
            raise ValueError(f"{name}: {what} {array.reshape(-1)[bad[0]]} at index {where} is outside "
                             f"{range_text or f'[{lo}, {hi}]'}")
    return array


def mask_array(name, array):
    """A padding mask (bools, or numbers that are each 0 or 1) as a bool array; ValueError naming the first
    other value."""
    if array.dtype.kind == "f":
        bad = np.flatnonzero((array != 0) & (array != 1))  # NaN included
        if bad.size:
            where = tuple(int(i) for i in np.unravel_index(bad[0], array.shape))
            raise ValueError(f"{name}: value {array.reshape(-1)[bad[0]]} at index {where} is not 0 or 1")
        return array != 0
    return int_array(name, array, 0, 1) != 0
