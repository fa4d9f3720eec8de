"""The box's installer choice without a box: pip options uv takes, pip's settings handed to
uv, uv's error lines, and index credentials (remote/agent/installers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from outrig._box.agent.installers import (
    Unsupported,
    pip_settings,
    public_url,
    translate_pip_args,
    url_secrets,
    uv_install_argv,
    uv_missing,
)


def test_pip_args_translate_or_name_what_uv_does_not_take() -> None:
    argv, env = translate_pip_args(["--pre", "--timeout", "60", "--retries=0", "-c", "c.txt",
                                    "--no-cache-dir", "-q", "--force-reinstall"])
    assert argv == ["--prerelease=allow", "-c", "c.txt", "--no-cache", "--reinstall"]
    assert env == {"UV_HTTP_TIMEOUT": "60", "UV_HTTP_RETRIES": "0"}
    with pytest.raises(Unsupported, match="--no-warn-conflicts"):
        translate_pip_args(["--no-warn-conflicts"])
    with pytest.raises(Unsupported, match="index_url"):
        translate_pip_args(["--index-url", "https://example.invalid/simple"])


def test_pip_settings_reach_uv_and_urls_stay_out_of_argv(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.invalid/simple\n"
                    "extra-index-url = https://a.invalid/simple\n  https://b.invalid/simple\n"
                    "[install]\nconstraint = /etc/c.txt\nfind_links = /wheels\n")
    environ = {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path), "PATH": "/usr/bin",
               "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    settings = pip_settings(environ, str(tmp_path / "venv"))
    assert settings.index_url == "https://mirror.invalid/simple"
    assert settings.extra_index_urls == ["https://a.invalid/simple", "https://b.invalid/simple"]
    assert settings.constraints == ["/etc/c.txt"] and settings.find_links == ["/wheels"]
    argv, env = uv_install_argv("uv", "/v/bin/python", ["x==1"], index_url=None,
                                extra_index_urls=["https://u:tok3n@c.invalid/simple"],
                                find_links=[], no_index=False, pip_args=[], environ=environ,
                                site_prefix=str(tmp_path / "venv"))
    assert env["UV_INDEX_URL"] == "https://mirror.invalid/simple"
    assert env["UV_EXTRA_INDEX_URL"].split() == [
        "https://a.invalid/simple", "https://b.invalid/simple", "https://u:tok3n@c.invalid/simple"]
    assert argv[-1] == "x==1" and "tok3n" not in " ".join(argv)
    assert argv[argv.index("--index-strategy") + 1] == "unsafe-best-match"
    assert argv[argv.index("-c") + 1] == "/etc/c.txt"
    assert pip_settings({**environ, "PIP_CONFIG_FILE": os.devnull}, "/v").index_url is None


def test_uv_lines_and_credentials() -> None:
    lines = ["error: No solution found when resolving dependencies",
             "cause: Because nosuchpkg was not found in the package registry and you require "
             "nosuchpkg==1.0, we can conclude that your requirements are unsatisfiable.",
             "cause: Because there is no version of pkg==9.9 and you require pkg==9.9, we can "
             "conclude that your requirements are unsatisfiable."]
    assert uv_missing(lines) == ["nosuchpkg==1.0", "pkg==9.9"]
    assert url_secrets(["https://user:s%40cret@h/simple", None]) == ["s%40cret", "s@cret"]
    assert public_url("https://user:tok@h.invalid/simple") == "https://***@h.invalid/simple"


def test_a_half_made_bootstrap_venv_is_removed_so_the_next_try_starts_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m venv`` without ensurepip (Debian without python3-venv) leaves bin/python
    and fails; kept, it would pass for a made venv and every later try would fail at pip."""
    import io
    import sys

    from outrig._box.agent import provision
    from outrig._box.agent.events import Emitter

    fake = tmp_path / "python-without-ensurepip"
    fake.write_text(f"#!{sys.executable}\nimport os, sys\n"
                    "venv = sys.argv[-1]\nos.makedirs(os.path.join(venv, 'bin'))\n"
                    "open(os.path.join(venv, 'bin', 'python'), 'w').close()\n"
                    "print('Error: ensurepip is not available'); sys.exit(1)\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    env = provision.EnvSpec({"name": "demo", "path": str(tmp_path / "venv"),
                             "packages": ["x==1"]}, 0)
    state = tmp_path / ".outrig"
    ctx = provision.Installing(str(state), Emitter(io.BytesIO()), 1.0, 5.0, dict(os.environ), [])
    uv, why = provision.bootstrap_uv(env, ctx)
    assert uv is None and "making the bootstrap venv" in why and "ensurepip" in why
    assert not (state / "uv-bootstrap").exists()
