"""No silent covariates (issue 28, item 3): ``FederatedGP(covariates=[...])`` names them (``[]`` = intercept only);
without it the other columns are inferred, listed in a warning and the summary, and identifiers or near-copies of y
are refused with the fix."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from spatialfed.api import FederatedGP
from spatialfed.errors import DataError


def _table(n=60, seed=2):
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0, 1000, n), rng.uniform(0, 1000, n)
    elev = rng.uniform(0, 300, n)
    dayx = 40 + 0.05 * elev + np.sin(x / 300) + rng.normal(scale=0.5, size=n)
    return pd.DataFrame({"x": x, "y": y, "dayx": dayx, "record": np.arange(n), "elev": elev,
                         "joker": dayx * 1.0000001 + 1e-7})


def _gp(**kw):
    return FederatedGP(cluster="simulated", knots=9, max_iter=3, progress=False, **kw)


def test_an_id_column_and_a_copy_of_the_target_are_refused_not_fitted():
    frame = _table()
    with pytest.raises(DataError, match=r"'record' is named like an identifier.*covariates=\['elev'\] \(left out: "
                                        r"'record' is named like an identifier; 'joker' is a near-copy of y"):
        _gp().fit(frame, "dayx")
    with pytest.raises(DataError, match=r"'joker' is a near-copy of y .*covariates=\['elev'\]"):
        _gp().fit(frame.drop(columns="record"), "dayx")


def test_named_covariates_are_the_only_ones_and_nothing_is_said():
    frame = _table()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "inferred" warning for a named list
        gp = _gp(covariates=["elev"]).fit(frame, "dayx")
        assert gp.covariate_names_ == ["intercept", "elev"] and not gp.covariates_inferred_
        only = _gp(covariates=[]).fit(frame, "dayx")
    assert only.covariate_names_ == ["intercept"] and only.params_["gamma"].shape == (1,)
    assert clone(gp).get_params()["covariates"] == ["elev"]          # scikit-learn: the constructor stores it
    # prediction takes the named columns from a table that has more
    assert np.isfinite(gp.predict(frame.iloc[:5])).all()


def test_inferred_covariates_are_announced_in_a_warning_and_the_summary(capsys):
    frame = _table().drop(columns=["record", "joker"])
    with pytest.warns(UserWarning, match=r"covariates inferred from X's other columns: \['elev'\].*covariates=\[\]"):
        gp = FederatedGP(cluster="simulated", knots=9, max_iter=3).fit(frame, "dayx")
    assert gp.covariate_names_ == ["intercept", "elev"] and gp.covariates_inferred_
    err = capsys.readouterr().err
    assert "covariates: intercept, elev (INFERRED from X's other columns: name them with covariates=[...])" in err
