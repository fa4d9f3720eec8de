"""``outrig init``: a starter project (config, one host file, one playbook), each commented,
written in the current folder. Nothing reaches a box.

Two starters: ``hello`` (a small server and worker, no GPU) and ``dflash`` (the real job: a
DFlash drafter trained with vLLM and speculators, its two venvs under ``environments:``). The
dflash playbook is a file shipped in the wheel beside the recipe (package data), so the one
text that docs/dflash.md walks through is the one ``outrig init --dflash`` writes.

The files are written only where nothing is: a user's own project must never be clobbered by a
command meant for empty folders.
"""

from __future__ import annotations

from pathlib import Path

from outrig.cli.flags import friendly
from outrig.cli.taskspec import TaskContext, task
from outrig.errors import ConfigError

PROJECT_YAML = """\
# outrig's settings for this project (docs/cli.md lists every key).
# Flags win over OUTRIG_* environment variables, which win over this file, which wins
# over ~/.outrig.yaml.
host: box          # a file in hosts/ (without .yaml), an ~/.ssh/config alias or user@host:port
playbook: hello    # a file in playbooks/ (without .yaml)
"""

HOST_YAML = """\
# One box. outrig reaches it over SSH with your usual keys (ssh-agent, ~/.ssh/config).
# 203.0.113.10 is a placeholder that no box has: commands refuse it until you edit it.
hostname: 203.0.113.10        # address or ~/.ssh/config alias; 'local' runs on this machine
port: 22
user: root
# identity_file: ~/.ssh/id_ed25519   # optional
workdir: /workspace/outrig    # everything outrig writes on the box lives under here
env:                          # added to every remote command and process
  PATH: /root/.local/bin:$PATH
python: python3               # interpreter for the agent (3.8+, standard library only)
gpus: auto                    # detected with nvidia-smi; or an explicit count
"""

PLAYBOOK_YAML = """\
# A first job: a small HTTP server, and a worker that starts once the server answers.
# Try: outrig plan, outrig deploy, outrig status, outrig tail-logs, outrig cleanup.
# Change a param for one run without editing this file: outrig deploy --param port=8901
name: hello
params:
  port: 8900
  beats: 600
processes:
  server:
    command: python3 -m http.server ${port} --bind 127.0.0.1
    gpus: []                       # GPU indices this process gets (CUDA_VISIBLE_DEVICES)
    ready: {http: "http://127.0.0.1:${port}/", timeout: 60}
    stop: {grace: 5}               # seconds between SIGTERM and SIGKILL
  worker:
    after: server                  # starts once server is ready
    command: >-
      python3 -u -c "import time; [print('beat', i, flush=True) or time.sleep(1)
      for i in range(${beats})]"
    gpus: []
    ready: {log: "beat 0", timeout: 60}
"""

STARTER = {"outrig.yaml": PROJECT_YAML, "hosts/box.yaml": HOST_YAML,
           "playbooks/hello.yaml": PLAYBOOK_YAML}

# The dflash starter's host: the speculators venv's bin/ last on PATH, so that `outrig stage`
# finds its `hf` (huggingface_hub's CLI) for the box's own hub download; first-found wins, so
# the box's python3 is still the agent's.
DFLASH_HOST_YAML = HOST_YAML.replace(
    "  PATH: /root/.local/bin:$PATH\n",
    "  PATH: /root/.local/bin:$PATH:/workspace/venvs/speculators/bin   # `hf` for outrig stage\n")

TEMPLATES = ("hello", "dflash")


def dflash_playbook() -> str:
    """The dflash starter playbook, as shipped in the wheel."""
    from importlib import resources  # here: `outrig --list` imports this module

    return (resources.files("outrig.recipes") / "dflash-starter.yaml").read_text(
        encoding="utf-8")


def starter_files(template: str) -> dict[str, str]:
    """``{relative path: text}`` of one starter; an unknown name is a ConfigError."""
    if template == "hello":
        return dict(STARTER)
    if template == "dflash":
        return {"outrig.yaml": PROJECT_YAML.replace("playbook: hello ", "playbook: dflash"),
                "hosts/box.yaml": DFLASH_HOST_YAML, "playbooks/dflash.yaml": dflash_playbook()}
    raise ConfigError(f"--template {template!r}: no such starter; use one of "
                      f"{', '.join(TEMPLATES)}.")


def write_starter(folder: Path, *, force: bool = False,
                  template: str = "hello") -> list[Path]:
    """Write the starter files into ``folder``; refuse (nothing written) if any exists."""
    targets = {folder / name: text for name, text in starter_files(template).items()}
    present = [path for path in targets if path.exists()]
    if present and not force:
        raise ConfigError(
            f"outrig init would overwrite {', '.join(str(p) for p in present)}; nothing was "
            "written. Run it in an empty folder, or pass --force to replace these files.")
    for path, text in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(targets)


@task(auto_shortflags=False, help={
    "force": "overwrite outrig's starter files if present",
    "dflash": "the real job instead: playbooks/dflash.yaml, a DFlash drafter trained with vLLM "
              "and speculators, its two venvs under environments: (the same as --template "
              "dflash)",
    "template": "which starter: hello (default; no GPU) or dflash",
    "json": "print {project, wrote: [paths]} as JSON"})
@friendly
def init(c: TaskContext, force: bool = False, dflash: bool = False, template: str = "",
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
    from outrig.text.layout import paragraph
    from outrig.text.terminal import wrap_width

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
