"""Progress of a prediction over many locations (predict, map): a tqdm bar with its rate and ETA on stderr."""

from __future__ import annotations

from contextlib import contextmanager


def progress_bar(total: int, enabled: bool = True, desc: str = "predict", stream=None):
    """A tqdm bar over `total` locations with rate and ETA on stderr (None when disabled): refreshed twice a second
    on a terminal; in logs and pipes first shown after 15 s, then every 15 s (`counting` shows the final count)."""
    if not enabled:
        return None
    import sys

    from tqdm.auto import tqdm

    stream = stream or sys.stderr
    live = bool(getattr(stream, "isatty", lambda: False)())
    return tqdm(total=int(total), desc=desc, unit="pt", unit_scale=total >= 10_000, file=stream, dynamic_ncols=True,
                mininterval=0.5 if live else 15.0, delay=0.0 if live else 15.0, smoothing=0.1)


@contextmanager
def counting(total: int, enabled: bool = True, desc: str = "predict", stream=None):
    """progress_bar as a context: a run that finishes shows its final count (in a log too); one that fails closes
    its bar silently, so off a terminal its one error line stands alone (nothing was shown before 15 s)."""
    bar = progress_bar(total, enabled, desc, stream)
    try:
        yield bar
    except BaseException:
        if bar is not None:
            bar.close()
        raise
    if bar is not None:
        bar.delay = 0.0
        bar.close()
