"""FitConfig: mode-dependent defaults (SPEC §4, Remark 8), the scheme as a type, and errors that name the fix."""

import pytest

from spatialfed.algorithm.config import BlockScheme, FitConfig, StatsPolicy, Stopping


def test_sync_defaults_are_the_unhandicapped_baseline():
    cfg = FitConfig().resolved(10)
    assert (cfg.mode, cfg.agg_threshold, cfg.block.alpha) == ("sync", 10, 1.0)
    assert not (cfg.block.correction or cfg.block.adaptive_weights or cfg.block.moving_average)


def test_async_defaults_follow_remark_8():
    config = FitConfig.of(mode="async").resolved(10)
    cfg = config.block
    assert config.agg_threshold == 2 and cfg.alpha == pytest.approx(0.5 * 2 / 10)
    assert cfg.correction and cfg.adaptive_weights and cfg.moving_average
    assert (cfg.a, cfg.T_c, cfg.omega, cfg.t_M) == (1.0, 3, 0.7, 8)
    assert FitConfig.of(mode="async").resolved(3).agg_threshold == 1
    assert FitConfig.of(mode="async", agg_threshold=4, alpha=0.9).resolved(8).block.alpha == 0.9


def test_each_strategy_switches_off_alone_and_basic_has_none():
    cfg = FitConfig.of(mode="async", moving_average=False).resolved(5).block
    assert cfg.correction and cfg.adaptive_weights and not cfg.moving_average
    basic = FitConfig.basic(agg_threshold=2).resolved(5)
    b = basic.block
    assert basic.mode == "async" and not (b.correction or b.adaptive_weights or b.moving_average)
    assert FitConfig.basic(correction=True).resolved(5).block.correction


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="fast"), "mode must be one of"),
    (dict(hessian="bfgs"), "hessian must be one of"),
    (dict(mean_step="gls"), "mean_step must be one of"),
    (dict(alpha_rule="adaptive"), "alpha_rule must be one of"),
    (dict(agg_threshold=0), "agg_threshold must be an integer in 1..J"),
    (dict(alpha=1.5), "alpha"),
    (dict(omega=1.0), "omega"),
    (dict(tol=0), "tol must be > 0"),
    (dict(max_iter=0), "max_iter must be an integer"),
    (dict(time_budget=-1), "time_budget"),
])
def test_invalid_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FitConfig.of(**kwargs)


def test_threshold_checked_against_J():
    with pytest.raises(ValueError, match=r"1..J = 1..4"):
        FitConfig.of(mode="async", agg_threshold=5).resolved(4)
    with pytest.raises(ValueError, match="mode='sync' aggregates all J = 4"):
        FitConfig.of(mode="sync", agg_threshold=2).resolved(4)
    assert FitConfig.of(mode="sync", agg_threshold=4).resolved(4).agg_threshold == 4


def test_joint_mean_step_is_the_default_and_tuned_names_its_settings():
    assert FitConfig().block.mean_step == "joint" and FitConfig.of(mean_step="block").block.mean_step == "block"
    tuned = FitConfig.tuned(agg_threshold=2).resolved(10)
    t = tuned.block
    assert (tuned.mode, tuned.agg_threshold, t.alpha, t.alpha_rule) == ("async", 2, 1.0, "staleness")
    assert t.correction and not (t.adaptive_weights or t.moving_average)
    assert FitConfig.tuned(moving_average=True).resolved(10).block.moving_average


def test_the_statistics_policy_travels_with_the_config_and_keeps_its_ladder():
    """StatsPolicy is reachable from FitConfig, written by as_dict (fit.json, checkpoints) and read back; the reaches
    must nest (stale_tol ≤ settle_tol < secant_reach < taylor_radius)."""
    config = FitConfig.stats(mode="async", policy={"explore": False, "taylor_radius": 0.4})
    assert isinstance(config.scheme, StatsPolicy) and config.policy.taylor_radius == 0.4
    back = FitConfig.from_dict(config.as_dict())
    assert back == config and back.as_dict()["policy"]["explore"] is False
    assert FitConfig.stats().policy == StatsPolicy() and FitConfig().policy is None
    assert "policy" not in FitConfig().as_dict() and FitConfig().as_dict()["scheme"] == "block"
    for bad in ({"secant_reach": 0.6}, {"settle_tol": 0.3}, {"stale_tol": 0.02}):
        with pytest.raises(ValueError, match="stale_tol ≤ settle_tol < secant_reach < taylor_radius"):
            StatsPolicy(**bad)
    with pytest.raises(ValueError, match="min_coverage"):
        StatsPolicy(min_coverage=0.0)


def test_a_retired_policy_setting_is_refused_with_its_reason_unless_it_is_off():
    """hold_share is gone (config.RETIRED): asking for a hold names the reason; its off value 0 is accepted, so the
    settings of an earlier fit that did not hold are still a valid policy."""
    with pytest.raises(ValueError, match="hold_share was removed: slow sites are no longer held back"):
        FitConfig.stats(mode="async", policy={"hold_share": 0.15})
    assert FitConfig.stats(mode="async", policy={"hold_share": 0.0}).policy == StatsPolicy()
    with pytest.raises(ValueError, match="refine_step was removed: idle sites no longer answer near"):
        FitConfig.stats(mode="async", policy={"refine_step": 0.03})
    assert FitConfig.stats(mode="async", policy={"refine_step": None}).policy == StatsPolicy()  # its off value


def test_the_scheme_is_a_type_and_each_setting_lives_in_one_place():
    """Flat settings sort into FitConfig, Stopping and the scheme's own type; a setting of the other scheme is
    refused in one line naming the preset that has it, and a block config cannot reach the statistics server."""
    config = FitConfig.of(mode="async", max_iter=7, tol=1e-6, alpha=0.5, step_bound=0.5)
    assert isinstance(config.scheme, BlockScheme) and config.scheme_name == "block"
    assert config.stopping == Stopping(max_iter=7, tol=1e-6) and config.block.alpha == 0.5 and config.step_bound == 0.5
    stats = FitConfig.stats(mode="sync", settle_tol=0.02, max_iter=9)
    assert stats.scheme == StatsPolicy(settle_tol=0.02) and stats.stopping.max_iter == 9
    with pytest.raises(TypeError, match="no block settings"):
        stats.block
    with pytest.raises(ValueError, match="correction set\\(s\\) the block scheme's strategies, which preset 'stats'"):
        FitConfig.preset("stats", "async", correction=True)
    with pytest.raises(ValueError, match="settle_tol set\\(s\\) the statistics scheme's policy"):
        FitConfig.of("block", settle_tol=0.02)
    with pytest.raises(ValueError, match="unknown fit setting\\(s\\) \\['speed'\\]"):
        FitConfig.of(speed=2)
    with pytest.raises(ValueError, match="privacy noise is calibrated for the block scheme"):
        FitConfig.stats(privacy={"noise_multiplier": 1.0, "clip": 1.0})


def test_a_flat_config_of_an_earlier_version_reads_back():
    """Checkpoints and fit.json files written before the split hold every setting flat, both schemes' together."""
    flat = {"mode": "async", "agg_threshold": 1, "alpha": None, "alpha_rule": "fixed", "correction": None,
            "adaptive_weights": None, "moving_average": None, "dominance": False, "staleness_bound": None,
            "privacy": None, "a": 1.0, "T_c": 3, "omega": 0.7, "t_M": 8, "hessian": "profile", "mean_step": "joint",
            "step_bound": 1.0, "eig_floor": 1e-6, "max_iter": 40, "tol": 1e-5, "patience": 3, "time_budget": None,
            "n_workers": 4, "scheme": "stats", "policy": {"settle_tol": 0.02, "hold_share": 0.0},
            "secure_aggregation": False}
    config = FitConfig.from_dict(flat)
    assert config.scheme == StatsPolicy(settle_tol=0.02) and config.stopping.max_iter == 40 and config.n_workers == 4
    block = FitConfig.from_dict({**flat, "scheme": "block", "policy": None, "omega": 0.5})
    assert block.block.omega == 0.5 and block.policy is None
