"""Reading a user's TOML file (a run config, a price table) with one-line reasons for every failure."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class TomlFileError(ValueError):
    """The file cannot be read as TOML; the message is the reason, without the path."""


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise TomlFileError("not found") from None
    except IsADirectoryError:
        raise TomlFileError("is a directory, not a TOML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TomlFileError(f"cannot read it ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise TomlFileError(f"not valid TOML ({e})") from None
