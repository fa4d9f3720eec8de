"""``outrig init``: a starter project in the current folder (the files are
:mod:`outrig.starter`'s). Nothing reaches a box.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrig.cli.flags import friendly
from outrig.taskspec import task


@task(auto_shortflags=False, help={
    "force": "overwrite outrig's starter files if present",
    "dflash": "the real job instead: playbooks/dflash.yaml, a DFlash drafter trained with vLLM "
              "and speculators, its two venvs under environments: (the same as --template "
              "dflash)",
    "template": "which starter: hello (default; no GPU) or dflash",
    "json": "print {project, wrote: [paths]} as JSON"})
@friendly
def init(c: Any, force: bool = False, dflash: bool = False, template: str = "",
         json: bool = False) -> None:
    """Write a starter project here: outrig.yaml, hosts/box.yaml and a playbook.

    The playbook is playbooks/hello.yaml (a small server and worker), or with --dflash
    playbooks/dflash.yaml (the DFlash job; docs/dflash.md walks through it). Each file is
    commented; edit hosts/box.yaml to point at your box, then outrig check and outrig deploy.
    Existing files are never overwritten (without --force).

    Example:
        mkdir my-runs && cd my-runs && outrig init --dflash
    """
    from outrig.console import Reporter  # at run time only: --help loads no console
    from outrig.errors import ConfigError
    from outrig.starter import write_starter
    from outrig.terminal import wrap_width
    from outrig.textlayout import paragraph

    if dflash and template not in ("", "dflash"):
        raise ConfigError(f"--dflash and --template {template} name two starters; give one.")
    chosen = "dflash" if dflash else (template or "hello")
    written = write_starter(Path.cwd(), force=force, template=chosen)
    if json:
        Reporter(json_mode=True).emit_json({"project": str(Path.cwd()),
                                            "wrote": [str(p) for p in written]})
        return
    for path in written:
        print(f"wrote {path}")
    then = ("`outrig plan`, `outrig provision`, `outrig stage` and `outrig deploy --test`"
            if chosen == "dflash" else "`outrig check` and `outrig deploy`")
    print(paragraph(f"next: edit hosts/box.yaml (hostname, user, workdir), then {then}",
                    wrap_width()))
