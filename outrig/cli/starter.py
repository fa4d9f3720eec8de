"""``outrig init``: a starter project in the current folder (the files are
:mod:`outrig.starter`'s). Nothing reaches a box.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrig.cli.flags import friendly
from outrig.taskspec import task


@task(auto_shortflags=False, help={"force": "overwrite outrig's starter files if present",
                                   "json": "print {project, wrote: [paths]} as JSON"})
@friendly
def init(c: Any, force: bool = False, json: bool = False) -> None:
    """Write a starter project here: outrig.yaml, hosts/box.yaml and playbooks/hello.yaml.

    Each file is commented; edit hosts/box.yaml to point at your box, then
    outrig check and outrig deploy. Existing files are never overwritten (without --force).

    Example:
        mkdir my-runs && cd my-runs && outrig init
    """
    from outrig.console import Reporter  # at run time only: --help loads no console
    from outrig.starter import write_starter
    from outrig.terminal import wrap_width
    from outrig.textlayout import paragraph

    written = write_starter(Path.cwd(), force=force)
    if json:
        Reporter(json_mode=True).emit_json({"project": str(Path.cwd()),
                                            "wrote": [str(p) for p in written]})
        return
    for path in written:
        print(f"wrote {path}")
    print(paragraph("next: edit hosts/box.yaml (hostname, user, workdir), then `outrig check` "
                    "and `outrig deploy`", wrap_width()))
