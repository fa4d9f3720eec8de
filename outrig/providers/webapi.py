"""JSON over HTTPS for the provider modules, with the standard library (no SDK: their pinned
dependencies fight a vLLM-era environment).

The key goes in the ``Authorization`` header only, never in the URL (a URL ends up in proxy
and error logs). An error answer becomes a :class:`~outrig.providers.base.ProviderError`
naming the call, the HTTP status and the provider's own message, with the key replaced by
``***`` should the provider echo it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from outrig.providers.base import ProviderError
from outrig.providers.keys import ApiKey

TIMEOUT = 30.0


class HttpError(ProviderError):
    """An error answer: ``status`` is the HTTP status, ``body`` the decoded answer."""

    def __init__(self, message: str, status: int, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True)
class JsonApi:
    """One provider's API: its base URL and key."""

    provider: str
    base_url: str
    key: ApiKey

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``method path`` with a JSON body; the decoded JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url.rstrip("/") + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.key.value}",
                     "Content-Type": "application/json", "Accept": "application/json",
                     "User-Agent": "outrig"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            decoded = _decode(raw)
            raise HttpError(self.clean(f"{self.provider} {method} {path} answered HTTP "
                                        f"{exc.code}: {_message(decoded)}"),
                            exc.code, decoded) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ProviderError(self.clean(f"{self.provider} {method} {path} failed: "
                                            f"{reason}; check the network and try again")
                                ) from None
        return _decode(raw)

    def clean(self, text: str) -> str:
        """``text`` with the key replaced by ``***``."""
        return text.replace(self.key.value, "***") if self.key.value else text


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError:
        return raw.decode("utf-8", errors="replace").strip()[:300]


def _message(body: Any) -> str:
    """The provider's own words: ``msg``/``message``/``error`` of a JSON error, or the text."""
    if isinstance(body, dict):
        for key in ("msg", "message", "error", "detail"):
            if body.get(key):
                return str(body[key])
        return json.dumps(body)[:300]
    return str(body or "(no body)")
