"""Named heterogeneity profiles (runtime/heterogeneity.py): slowdown = 62 / cores."""

import numpy as np
import pytest

from spatialfed.runtime.heterogeneity import MAX_CORES, profile_slowdowns, resolve_slowdowns


def test_graded_with_a_minimum_spreads_the_cores_evenly_down_to_it():
    s = profile_slowdowns("graded:12", 10)
    np.testing.assert_allclose(MAX_CORES / s, np.linspace(62.0, 12.0, 10), rtol=1e-12)
    assert s[0] == 1.0 and s[-1] == pytest.approx(62.0 / 12.0) and np.all(np.diff(s) > 0)
    np.testing.assert_allclose(profile_slowdowns("graded:3", 10), profile_slowdowns("graded", 10), rtol=1e-12)
    np.testing.assert_allclose(profile_slowdowns("graded:62", 4), np.ones(4))
    np.testing.assert_allclose(resolve_slowdowns("graded:31", 3), [1.0, 62.0 / 46.5, 2.0])
    assert profile_slowdowns("graded:12", 1).tolist() == [1.0]


@pytest.mark.parametrize("name", ["graded:0", "graded:-3", "graded:63", "graded:x", "graded:", "gradual"])
def test_a_bad_profile_name_says_what_to_give(name):
    with pytest.raises(ValueError, match="graded:<min cores>|minimum cores must be a number in"):
        profile_slowdowns(name, 10)
