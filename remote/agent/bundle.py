"""The agent as one bundle: how it is packed, sent and started on the box.

The workstation sends this package on every call as one zip (the package's ``*.py`` files
under ``outrig_agent/`` plus a top-level ``__main__.py``, see ``_bundle_main.py``), compressed
with zlib. :data:`BOOTSTRAP` is the one command the box runs (``python -S -c BOOTSTRAP DIGEST
WORKDIR BUNDLE REQUEST``):

- ``BUNDLE`` is the compressed zip in base64, or ``-`` when it comes on stdin as a length line
  and the raw bytes (then the request follows on stdin too: requests carrying secrets never
  travel in argv or the environment);
- ``REQUEST`` is the request line compressed and in base64, or empty when it comes on stdin.

When ``<workdir>/.outrig/agent/<DIGEST>/`` holds this bundle unpacked (its ``BUNDLE`` file
lists every file's size), the bootstrap ``execv``'s ``python -S <that folder>`` at once, with
the request in ``OUTRIG_REQUEST`` (popped by the agent before it does anything), so ``ps``
on the box shows one short line; the unpacker compiled the package there (``compileall``), so
the start loads compiled code even where ``PYTHONDONTWRITEBYTECODE`` is set.
Otherwise the bundle's ``__main__.py`` unpacks it there and does the same; where the folder
cannot be written (no workdir yet, a full or read-only disk) the agent runs from the zip in
memory. The same bundle is what ``peer_pull`` sends to the other box.

Used on both sides: the workstation imports it as ``outrig._box.agent.bundle``.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import sys
import zipfile
import zlib
from typing import Dict, List, Optional, Set

from .protocol import REQUEST_ENV

PACKAGE = "outrig_agent"  # the package's name inside the bundle
ENTRY = "_bundle_main.py"  # becomes the bundle's top-level __main__.py
MARK = "BUNDLE"  # in an unpacked bundle: the digest, then each file's name and size
CACHE_PARTS = (".outrig", "agent")  # <workdir>/.outrig/agent/<digest>/
KEEP_WHOLE = ("wrap.py",)  # files the box keeps for people to read: sent as they are
_DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_STAMP = (2020, 1, 1, 0, 0, 0)  # every zip entry's date: the same sources give the same bytes

BOOTSTRAP = "\n".join([
    "import sys,os",
    "sys.version_info<(3,8) and sys.exit('outrig agent needs Python >= 3.8, this is '"
    "+sys.version.split()[0])",
    "a=sys.argv",
    "c=os.path.join(os.path.expanduser(a[2]),'.outrig','agent',a[1]) if a[2] else ''",
    "def r(n):",
    " b=b''",
    " while len(b)<n:",
    "  k=os.read(0,n-len(b))",
    "  if not k:break",
    "  b+=k",
    " return b",
    "if a[3]=='-':",
    " n=b''",
    " while not n.endswith(b'\\n'):",
    "  k=os.read(0,1)",
    "  if not k:break",
    "  n+=k",
    " z=r(int(n))",
    "else:z=a[3]",
    "if a[4]:os.environ['" + REQUEST_ENV + "']=a[4]",
    "try:",
    " m=open(os.path.join(c,'" + MARK + "'),'rb').read().split()",
    " k=m[0]==a[1].encode() and all(os.path.getsize(os.path.join(c,m[i].decode()))"
    "==int(m[i+1]) for i in range(1,len(m),2))",
    "except Exception:k=0",
    "if k and sys.executable:os.execv(sys.executable,[sys.executable,'-S',c])",
    "import zlib,base64,zipfile,io",
    "z=zlib.decompress(base64.b64decode(z) if isinstance(z,str) else z)",
    "exec(compile(zipfile.ZipFile(io.BytesIO(z)).read('__main__.py'),'outrig-agent/__main__.py',"
    "'exec'),{'__name__':'__main__','BUNDLE':z,'CACHE':c,'DIGEST':a[1]})",
])


def package_sources() -> Dict[str, bytes]:
    """This package's ``*.py`` files by name: from its folder, or from the loader that holds
    the bundle in memory (``_bundle_main.MemoryImporter``), so the box re-sends exactly what
    it runs."""
    files = getattr(getattr(sys.modules.get(__name__), "__loader__", None), "files", None)
    if isinstance(files, dict):
        prefix = PACKAGE + "/"
        return {name[len(prefix):]: data for name, data in files.items()
                if name.startswith(prefix) and "/" not in name[len(prefix):]}
    folder = os.path.dirname(os.path.abspath(__file__))
    out: Dict[str, bytes] = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                out[name] = f.read()
    return out


def strip_source(source: bytes) -> bytes:
    """The module with its docstrings emptied and its comment lines blank, line for line (so a
    traceback on the box names the same lines as the source here): about a quarter less to
    send on every call. Lines inside other string literals (scripts the agent runs) are kept.
    Stripping stripped text changes nothing, so a box re-sends exactly what it got."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    kept: Set[int] = set()  # lines inside string literals
    docs: List[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            kept.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, _DOC_OWNERS) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docs.append(first.value)
    for doc in docs:  # byte offsets, as ast gives them
        row, end_row = doc.lineno, doc.end_lineno or doc.lineno
        head = lines[row - 1][:doc.col_offset]
        tail = lines[end_row - 1][doc.end_col_offset or 0:]
        lines[row - 1:end_row] = [head + b'""' + tail] if row == end_row else (
            [head + b'""\n'] + [b"\n"] * (end_row - row - 1) + [tail])
    for number in range(1, len(lines) + 1):
        if number not in kept and lines[number - 1].lstrip().startswith(b"#"):
            lines[number - 1] = b"\n"
    return b"".join(lines)


def build_bundle(sources: Dict[str, bytes]) -> bytes:
    """The zip (stored, not deflated: the whole zip is compressed once for the trip, which
    packs better), byte-identical for identical sources on any machine. Modules are sent
    stripped (:func:`strip_source`); wrap.py, which the box keeps as a file, is sent whole."""
    buffer = io.BytesIO()
    sent = {name: data if name in KEEP_WHOLE else strip_source(data)
            for name, data in sources.items()}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        entries = [("__main__.py", sent[ENTRY])]
        entries += [(f"{PACKAGE}/{name}", data) for name, data in sorted(sent.items())]
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_STAMP)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buffer.getvalue()


def digest_of(bundle: bytes) -> str:
    """Names the bundle's folder on the box (changes with every source change)."""
    return hashlib.sha256(bundle).hexdigest()[:20]


def running_digest() -> str:
    """The digest of the bundle this process runs: from the unpacked folder's mark (which the
    bootstrap checked against the digest it was started with, file by file), else rebuilt
    from the sources in memory (the same bytes, since stripping is idempotent). The live
    agent reports it, so the keeper never serves a request with another bundle's code."""
    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(folder, MARK), "rb") as f:
            words = f.read().split()
        if words:
            return words[0].decode()
    except OSError:
        pass
    return digest_of(build_bundle(package_sources()))


def pack(bundle: bytes) -> bytes:
    """The bundle compressed for the trip."""
    return zlib.compress(bundle, 9)


def bootstrap_argv(python: str, digest: str, workdir: str, bundle_b64: Optional[str],
                   request_b64: Optional[str]) -> List[str]:
    """The one exec: ``bundle_b64``/``request_b64`` None means "on stdin" (length-prefixed
    bundle first, then the request line). An empty ``workdir`` disables the folder cache."""
    return [python, "-S", "-c", BOOTSTRAP, digest, workdir, bundle_b64 or "-", request_b64 or ""]
