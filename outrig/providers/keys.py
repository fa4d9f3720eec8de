"""A provider's API key: from its environment variable, else from a file named in
outrig.yaml (``providers: NAME: api_key_file: PATH``) that only its owner can read.

Never from the command line (argv is visible to every user of the machine in ``ps``), and
never into a message: errors name the variable or the file, not the key. The key object's
``repr`` is masked, so a traceback or a log of the provider's settings cannot show it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outrig.errors import ConfigError


@dataclass(frozen=True)
class ApiKey:
    """The key, masked wherever it could be printed."""

    value: str
    source: str  # "VAST_API_KEY" or the file's path: what messages name

    def __repr__(self) -> str:
        return f"ApiKey(from {self.source}, ***)"

    __str__ = __repr__


def load_key(provider: str, env_var: str, config: dict[str, Any], root: Path) -> ApiKey:
    """The key of ``provider`` (the module docstring); a ConfigError with the fix when there
    is none or its file is readable by others (nothing is rented)."""
    value = os.environ.get(env_var, "").strip()
    if value:
        return ApiKey(value, env_var)
    named = config.get("api_key_file")
    if not named:
        raise ConfigError(f"no API key for {provider}: set {env_var} in the environment, or "
                          f"name a file holding it in outrig.yaml (providers: {provider}: "
                          f"api_key_file: PATH, mode 0600). Nothing was rented.")
    path = Path(str(named)).expanduser()
    if not path.is_absolute():
        path = root / path
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"providers: {provider}: api_key_file {path} cannot be read "
                          f"({exc.strerror}); fix the path in outrig.yaml. Nothing was "
                          "rented.") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"providers: {provider}: api_key_file {path} can be read by others "
                          f"(mode {stat.S_IMODE(mode):04o}); run chmod 600 {path}. Nothing "
                          "was rented.")
    if not text:
        raise ConfigError(f"providers: {provider}: api_key_file {path} is empty; put the key "
                          "in it. Nothing was rented.")
    return ApiKey(text, str(path))
