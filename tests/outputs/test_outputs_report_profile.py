"""report.html names the sites' emulated speeds as given: a profile's name, or explicit slowdowns as factors."""

from spatialfed.outputs.report import _profile


def test_explicit_slowdowns_are_shown_as_factors_not_as_the_default_profile_name():
    assert _profile({"profile": "balanced", "slowdowns": [1.0, 1.0, 1.0, 62 / 3, 1.0]}) == "slowdowns 1, 1, 1, 20.7, 1"
    assert _profile({"profile": "balanced", "slowdowns": [1.0, 1.0]}) == "balanced"
    assert _profile({"profile": "straggler", "slowdowns": [1.0, 62 / 3]}) == "straggler"
    assert _profile({}) is None
