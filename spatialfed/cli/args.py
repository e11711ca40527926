"""Argument types shared by the `spatialfed` commands."""

from __future__ import annotations

import argparse


def number_list(kind: type, example: str):
    """An argparse type parsing comma-separated values of `kind` (e.g. '100,200'), at least one."""

    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as {example}, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one number, such as {example}")
        return values

    parse.__name__ = f"{kind.__name__}_list"
    return parse


int_list = number_list(int, "100,200")
float_list = number_list(float, "1,1,4")
