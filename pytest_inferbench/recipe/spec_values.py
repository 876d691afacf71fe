"""A launch spec's values read one by one, each problem a `LaunchSpecError` naming the file and
the key path (`recipe.launch` reads whole specs with these), and the placeholder filling both
the argv words and the config files' values share.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


class LaunchSpecError(Exception):
    """A launch spec is missing or malformed; the message names the file."""


def fill_placeholders_in(value: object, values: dict[str, str]) -> object:
    """Placeholders in a config file's string values (`num_nextn_predict_layers:
    '{mtp_tokens}'`); a value that is a placeholder alone becomes a number when it is one."""
    if isinstance(value, dict):
        return {k: fill_placeholders_in(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_placeholders_in(v, values) for v in value]
    if isinstance(value, str):
        filled = fill_placeholders(value, values)
        if filled != value and filled.isdigit():
            return int(filled)
        return filled
    return value


def read_port(path: Path, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise LaunchSpecError(f"{path}: port: {value!r} (expected an integer within [1, 65535])")
    return value


def read_seconds(path: Path, value: object) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise LaunchSpecError(f"{path}: startup-timeout: {value!r} (expected a finite number of "
                              "seconds > 0)")
    return float(value)


def read_count(path: Path, where: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LaunchSpecError(f"{path}: {where}: {value!r} (expected an integer >= {minimum})")
    return value


def read_files(path: Path, where: str, value: object) -> dict[str, dict[str, object]]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and "/" not in k and k not in {".", ".."} and isinstance(v, dict)
            for k, v in value.items()):
        raise LaunchSpecError(f"{path}: {where}: expected a mapping of plain file names to "
                              "YAML mappings (the file's content)")
    return dict(value)


def deep_merge(base: dict[str, object], extra: dict[str, object]) -> dict[str, object]:
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        out[key] = (deep_merge(old, value) if isinstance(old, dict) and isinstance(value, dict)
                    else value)
    return out


def fill_placeholders(word: str, values: dict[str, str]) -> str:
    # Plain replacement of known placeholders only: JSON arguments keep their braces.
    for placeholder, value in values.items():
        word = word.replace(placeholder, value)
    return word


def check_keys(path: Path, where: str, value: object, allowed: tuple[str, ...]
                ) -> dict[str, object]:
    if not isinstance(value, dict):
        raise LaunchSpecError(f"{path}: {where or '<top level>'}: expected a mapping")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise LaunchSpecError(f"{path}: {where + '.' if where else ''}{unknown[0]}: unknown key "
                              f"(expected one of: {', '.join(allowed)})")
    return value


def read_str_list(path: Path, where: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise LaunchSpecError(f"{path}: {where}: expected a list of strings (argv words)")
    return [str(v) for v in value]


def read_str_dict(path: Path, where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise LaunchSpecError(f"{path}: {where}: expected a mapping of names to values")
    return {str(k): str(v) for k, v in value.items()}
