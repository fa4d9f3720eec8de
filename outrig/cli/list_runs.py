"""``outrig runs``: the history of runs, every box at once (:mod:`outrig.ops.list_runs`).

Apart from :mod:`outrig.cli.run_tasks`, whose tasks act on one run (or one run per host): this
one reads the journal across every box it names, and contacts only to reconcile.
"""

from __future__ import annotations

from outrig.cli.flags import NO_KEEP_HELP, PROJECT_HELP, friendly, make_reporter
from outrig.cli.settings import settings_for
from outrig.cli.taskspec import TaskContext, task


@task(
    auto_shortflags=False,
    iterable=["host"],
    help={"host": "only the runs of these hosts (repeat, a,b, a group or 'all'), and ask "
                  "these boxes even when the journal has no run of them (default: every "
                  "host the journal has a run of)",
          "playbook": "only the runs of this playbook",
          "all": "every run the journal knows (default: the newest 20, and any older one "
                 "still running or moved and not fenced)",
          "max_parallel": "how many boxes are asked at once (default 32)",
          "deadline": "seconds each box may take to answer before its runs are shown as "
                      "last seen (default: from its last RTT)",
          "no_keep": NO_KEEP_HELP, "project": PROJECT_HELP,
          "json": "print one JSON document {runs, hosts, hidden, all, at}"},
)
@friendly
def runs(c: TaskContext, host: list[str] | None = None, playbook: str | None = None,
         all: bool = False, max_parallel: str | None = None, deadline: str | None = None,
         project: str | None = None, no_keep: bool = False, json: bool = False) -> None:
    """List every run the journal knows, newest first, checked against the boxes.

    Per run: id, host, state as last seen, when it started and how long it ran, the last
    step/epoch/loss and newest complete checkpoint that status or watch saw, and a move or
    fencing. Every box is asked at once (one call each, a short deadline); a box that does
    not answer leaves its runs as last seen, marked "not seen since T". Exit 0 either way:
    a box that is gone is part of the history. See docs/cli.md.

    Examples:
        outrig runs
        outrig runs --host uk-node --playbook dflash-qwen36
        outrig runs --all --json
    """
    from outrig.cli.targets import fanout_limits, playbook_identity
    from outrig.inventory import HostBook
    from outrig.ops.list_runs import runs_history

    settings = settings_for(c, project, no_keep=no_keep)
    book = HostBook(settings.project.hosts_dir)
    hosts = settings.hosts(host, book=book) if [v for v in host or [] if v] else None
    bound, limit = fanout_limits(max_parallel, deadline)
    runs_history(settings.project, make_reporter(json), hosts=hosts,
                 playbook=playbook_identity(settings, playbook),
                 show_all=all, max_parallel=bound, deadline=limit, book=book)
