"""FitConfig: mode-dependent defaults (SPEC §4, Remark 8) and errors that name the fix."""

import pytest

from spatialfed.algorithm.config import FitConfig


def test_sync_defaults_are_the_unhandicapped_baseline():
    cfg = FitConfig().resolved(10)
    assert (cfg.mode, cfg.agg_threshold, cfg.alpha) == ("sync", 10, 1.0)
    assert not (cfg.correction or cfg.adaptive_weights or cfg.moving_average)


def test_async_defaults_follow_remark_8():
    cfg = FitConfig(mode="async").resolved(10)
    assert cfg.agg_threshold == 2 and cfg.alpha == pytest.approx(0.5 * 2 / 10)
    assert cfg.correction and cfg.adaptive_weights and cfg.moving_average
    assert (cfg.a, cfg.T_c, cfg.omega, cfg.t_M) == (1.0, 3, 0.7, 8)
    assert FitConfig(mode="async").resolved(3).agg_threshold == 1
    assert FitConfig(mode="async", agg_threshold=4, alpha=0.9).resolved(8).alpha == 0.9


def test_each_strategy_switches_off_alone_and_basic_has_none():
    cfg = FitConfig(mode="async", moving_average=False).resolved(5)
    assert cfg.correction and cfg.adaptive_weights and not cfg.moving_average
    basic = FitConfig.basic(agg_threshold=2).resolved(5)
    assert basic.mode == "async" and not (basic.correction or basic.adaptive_weights or basic.moving_average)
    assert FitConfig.basic(correction=True).resolved(5).correction


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
        FitConfig(**kwargs)


def test_threshold_checked_against_J():
    with pytest.raises(ValueError, match=r"1..J = 1..4"):
        FitConfig(mode="async", agg_threshold=5).resolved(4)
    with pytest.raises(ValueError, match="mode='sync' aggregates all J = 4"):
        FitConfig(mode="sync", agg_threshold=2).resolved(4)
    assert FitConfig(mode="sync", agg_threshold=4).resolved(4).agg_threshold == 4


def test_joint_mean_step_is_the_default_and_tuned_names_its_settings():
    assert FitConfig().mean_step == "joint" and FitConfig(mean_step="block").mean_step == "block"
    tuned = FitConfig.tuned(agg_threshold=2).resolved(10)
    assert (tuned.mode, tuned.agg_threshold, tuned.alpha, tuned.alpha_rule) == ("async", 2, 1.0, "staleness")
    assert tuned.correction and not (tuned.adaptive_weights or tuned.moving_average)
    assert FitConfig.tuned(moving_average=True).resolved(10).moving_average


def test_the_statistics_policy_travels_with_the_config_and_keeps_its_ladder():
    """StatsPolicy is reachable from FitConfig, written by as_dict (fit.json, checkpoints) and read back; the reaches
    must nest (stale_tol ≤ settle_tol < secant_reach < taylor_radius)."""
    from spatialfed.algorithm.config import StatsPolicy

    config = FitConfig.stats(mode="async", policy={"explore": False, "taylor_radius": 0.4})
    assert isinstance(config.policy, StatsPolicy) and config.stats_policy.taylor_radius == 0.4
    back = FitConfig(**config.as_dict())
    assert back.policy == config.policy and back.as_dict()["policy"]["explore"] is False
    assert FitConfig.stats().policy == StatsPolicy() and FitConfig().as_dict()["policy"] is None
    for bad in ({"secant_reach": 0.6}, {"settle_tol": 0.3}, {"stale_tol": 0.02}):
        with pytest.raises(ValueError, match="stale_tol ≤ settle_tol < secant_reach < taylor_radius"):
            StatsPolicy(**bad)
    with pytest.raises(ValueError, match="min_coverage"):
        StatsPolicy(min_coverage=0.0)


def test_a_retired_policy_setting_is_refused_with_its_reason_unless_it_is_off():
    """hold_share is gone (config.RETIRED): asking for a hold names the reason; its off value 0 is accepted, so the
    settings of an earlier fit that did not hold are still a valid policy."""
    from spatialfed.algorithm.config import StatsPolicy

    with pytest.raises(ValueError, match="hold_share was removed: slow sites are no longer held back"):
        FitConfig.stats(mode="async", policy={"hold_share": 0.15})
    assert FitConfig.stats(mode="async", policy={"hold_share": 0.0}).policy == StatsPolicy()
    with pytest.raises(ValueError, match="refine_step was removed: idle sites no longer answer near"):
        FitConfig.stats(mode="async", policy={"refine_step": 0.03})
    assert FitConfig.stats(mode="async", policy={"refine_step": None}).policy == StatsPolicy()  # its off value
