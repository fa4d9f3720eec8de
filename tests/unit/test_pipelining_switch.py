"""``OUTRIG_SSH_PIPELINE``: what each value pipelines, and a misspelt value refused before
anything is sent (a typo must not quietly mean the default)."""

from __future__ import annotations

import pytest

from outrig.connectors.ssh.pipelined_login import PIPELINE_ENV, pipelining_wanted
from outrig.errors import ConfigError


@pytest.mark.parametrize("value,wanted", [
    (None, (True, True)), ("", (True, True)), ("1", (True, True)),
    ("channel", (True, True)), (" Channel ", (True, True)),
    ("login", (True, False)), ("0", (False, False)), ("off", (False, False)),
])
def test_each_value_says_what_is_pipelined(monkeypatch: pytest.MonkeyPatch,
                                           value: str | None,
                                           wanted: tuple[bool, bool]) -> None:
    if value is None:
        monkeypatch.delenv(PIPELINE_ENV, raising=False)
    else:
        monkeypatch.setenv(PIPELINE_ENV, value)
    assert pipelining_wanted() == wanted


def test_a_misspelt_value_is_refused_with_the_values_it_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PIPELINE_ENV, "chanel")
    with pytest.raises(ConfigError) as caught:
        pipelining_wanted()
    text = str(caught.value)
    assert "OUTRIG_SSH_PIPELINE='chanel'" in text and "login" in text and "Nothing was sent" in text
    assert caught.value.exit_code == 2


def test_the_installed_paramiko_has_every_private_part_the_pipelined_login_uses() -> None:
    """Fails on a paramiko release that took one away (the login would then fall back)."""
    import paramiko
    from paramiko.auth_handler import AuthHandler
    from paramiko.channel import Channel

    from outrig.connectors.ssh.pipelined_login import missing_private_api
    assert missing_private_api({"AuthHandler": AuthHandler, "Transport": paramiko.Transport,
                                "Channel": Channel}) == []

    class Bare:
        pass
    missing = missing_private_api({"AuthHandler": Bare, "Transport": paramiko.Transport,
                                   "Channel": Channel})
    assert "AuthHandler._request_auth" in missing and "AuthHandler.wait_for_response" in missing
