"""io/curves.window_means (the TensorBoard train/... points of a chunk) equals, bit for bit, the
per-member, per-window means it replaced: finite losses only, NaN skipped for the other metrics."""

import warnings

import numpy as np
import pytest

from mhjax.io.curves import window_means


def reference(values, window, finite_only):
    n, m = values.shape
    out = np.full((-(-n // window), m), np.nan, np.float32)
    for j in range(m):
        for w, end in enumerate(range(window, n + window, window)):
            x = values[end - window : min(end, n), j]
            if finite_only:
                kept = x[np.isfinite(x)]
                out[w, j] = kept.mean() if kept.size else np.nan
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # an all-NaN window: "Mean of empty slice"
                    out[w, j] = np.nanmean(x)
    return out


@pytest.mark.parametrize("n, window", [(1, 1), (7, 1), (50, 1), (100, 2), (137, 3), (1000, 20), (1003, 21)])
def test_window_means_equal_the_per_member_loop(n, window):
    rng = np.random.default_rng(n)
    values = (rng.standard_normal((n, 5)) * 1e3).astype(np.float32)
    values[rng.random((n, 5)) < 0.05] = np.nan
    values[rng.random((n, 5)) < 0.03] = np.inf
    values[:, 0] = np.nan  # a diverged member: every point NaN
    for finite_only in (True, False):
        got = window_means(values, window, finite_only)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, reference(values, window, finite_only))
