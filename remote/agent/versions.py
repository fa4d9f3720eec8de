"""Version strings and requirements, as far as the agent checks them: pins of ``packages:``,
``requires.python`` and ``requires.driver`` (docs/provision.md).

Good enough for pins and driver or Python versions, not full PEP 440: release numbers (trailing
zeros dropped), then pre-release < final < post, a local label (``+cu130``) ignored unless a pin
names one. The workstation checks the same forms when the playbook loads
(outrig/formats/environments.py); these are the box's own checks of what it finds installed.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional, Tuple

from .events import bad_request

VERSION_CLAUSE_RE = re.compile(r"^(===|==|!=|~=|>=|<=|>|<)\s*([A-Za-z0-9.*+!_-]+)$")
REQUIREMENT_RE = re.compile(
    r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$")


def version_key(text: str) -> Optional[Tuple[Tuple[int, ...], int, str]]:
    """An orderable key for a version string: release numbers (trailing zeros dropped), then
    pre-release (-1) < final (0) < post (1), then the rest. A local label (``+cu130``) is
    dropped. Good enough for pins and driver/python versions; not full PEP 440."""
    public = text.strip().lower().split("+", 1)[0]
    if public.startswith("v"):
        public = public[1:]
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", public)
    if match is None:
        return None
    release = [int(x) for x in match.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    rest = match.group(2).lstrip(".-_")
    tag = 0 if not rest else (1 if rest.startswith(("post", "rev")) else -1)
    return tuple(release), tag, rest


def version_satisfies(version: str, spec: str) -> Optional[bool]:
    """Whether ``version`` meets ``spec`` (``>=3.10``, ``==0.33.0``, ``>=1,<2``, ``==2.*``);
    None when either cannot be read."""
    have = version_key(version)
    if have is None:
        return None
    for clause in [c.strip() for c in spec.split(",") if c.strip()]:
        match = VERSION_CLAUSE_RE.match(clause)
        if match is None:
            return None
        op, want_text = match.group(1), match.group(2)
        if op == "===":
            if version.strip() != want_text:
                return False
            continue
        if want_text.endswith(".*"):
            parts = want_text[:-2].split(".")
            if op not in ("==", "!=") or not all(x.isdigit() for x in parts):
                return None
            want_rel = [int(x) for x in parts]
            have_rel = list(have[0]) + [0] * len(want_rel)
            if (have_rel[: len(want_rel)] == want_rel) != (op == "=="):
                return False
            continue
        want = version_key(want_text)
        if want is None:
            return None
        if op == "==" and "+" in want_text:
            ok = version.strip().lower() == want_text.lower()
        elif op == "==":
            ok = have == want
        elif op == "!=":
            ok = have != want
        elif op == ">=":
            ok = have >= want
        elif op == "<=":
            ok = have <= want
        elif op == ">":
            ok = have > want
        elif op == "<":
            ok = have < want
        else:  # ~=: >= want, and the same release prefix without its last number
            prefix_len = max(1, len(want[0]) - 1)
            padded = list(have[0]) + [0] * max(0, prefix_len - len(have[0]))
            ok = have >= want and padded[:prefix_len] == list(want[0][:prefix_len])
        if not ok:
            return False
    return True


def normalize_dist(name: str) -> str:
    """PEP 503 name normalization (``Foo_Bar`` → ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Requirement(NamedTuple):
    """One ``packages:`` entry as far as checking it goes: name and version specifier."""

    text: str
    name: str  # normalized
    spec: str  # "" when any version will do (or a direct URL)


def parse_requirement(text: str, where: str) -> Requirement:
    """``vllm==0.33.0``, ``torch>=2.9,<2.15``, ``pkg[extra]==1``, ``pkg @ URL``, ``pkg; marker``."""
    body = text.split(";", 1)[0].strip()
    match = REQUIREMENT_RE.match(body)
    if match is None or text.strip().startswith("-"):
        raise bad_request(
            f"{where}: {text!r} is not a requirement like 'vllm==0.33.0' (pip options go in "
            "pip_args)"
        )
    rest = match.group(3).strip()
    if rest.startswith("@"):
        rest = ""
    elif rest and version_satisfies("1", rest) is None:
        raise bad_request(f"{where}: cannot read the version specifier {rest!r} of {text!r}")
    return Requirement(text=text.strip(), name=normalize_dist(match.group(1)), spec=rest)
