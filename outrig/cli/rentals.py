"""The tasks on rented boxes: ``rent`` one from a provider, list them (``boxes``) and
``release`` one (:mod:`outrig.providers`, docs/providers.md).

Apart from :mod:`outrig.cli.boxes`, whose tasks act on a box you already have (check,
provision, stage, exec...): these create and end boxes, and cost money.
"""

from __future__ import annotations

from outrig.cli.flags import JSON_HELP, PROJECT_HELP, friendly, make_reporter, number
from outrig.cli.settings import settings_for
from outrig.cli.taskspec import TaskContext, task


@task(
    auto_shortflags=False,
    help={"provider": "where to rent: runpod, vastai, or sandbox (boxes on this machine, "
                      "for trying outrig); keys and settings in outrig.yaml, see "
                      "docs/providers.md",
          "gpus": "COUNTxMODEL, e.g. 8xH100 (the model matched as a word of the offer's GPU "
                  "name)",
          "max_price": "US dollars per hour the box may cost at most (default: the cheapest "
                       "offer, within the budget of outrig.yaml)",
          "disk": "disk in GB to ask for (where the provider takes it)",
          "image": "the container image to ask for (where the provider takes it)",
          "name": "the box's name: hosts/NAME.yaml (default outrig-MODEL-XXXX)",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def rent(c: TaskContext, provider: str | None = None, gpus: str | None = None,
         max_price: str | None = None, disk: str | None = None, image: str | None = None,
         name: str | None = None, project: str | None = None, json: bool = False) -> None:
    """Rent a GPU box from a provider and write its host file (the box answers SSH).

    Takes the cheapest offer that matches --gpus (and --max-price and the project's budget),
    waits until its SSH answers and `check` passes with healthy GPUs; a box that fails is
    terminated and the next offer tried. Prints the price per hour and how long it took.
    See docs/providers.md.

    Examples:
        outrig rent --provider sandbox --gpus 8xH100
        outrig rent --provider sandbox --gpus 8xH100 --max-price 3 --name trainer-2
    """
    from outrig.errors import ConfigError
    from outrig.providers.renting import rent as rent_box

    if not provider or not gpus:
        raise ConfigError("rent needs --provider and --gpus, e.g. `outrig rent --provider "
                          "sandbox --gpus 8xH100`. Nothing was rented.")
    price = number(max_price, "max-price", 0, whole=False) if max_price is not None else None
    disk_gb = int(number(disk, "disk", 100)) if disk is not None else None
    settings = settings_for(c, project)
    reporter = make_reporter(json)
    result = rent_box(settings.project, provider, gpus, max_price=price, disk_gb=disk_gb,
                      image=image, name=name)
    if json:
        reporter.emit_json(result)
        return
    reporter.success(f"rented {result['name']} from {result['provider']} "
                     f"({result['instance_id']}) at ${result['price_per_hour']:.2f}/h in "
                     f"{result['seconds']:.1f}s")
    reporter.info(f"  host file hosts/{result['name']}.yaml; release it: outrig release "
                  f"{result['name']}")
    for line in result["tried"]:
        reporter.info(f"  passed over: {line}")


@task(
    auto_shortflags=False,
    help={"all": "released and gone boxes too",
          "provider": "also ask this provider for boxes outrig has no record of (orphans)",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def boxes(c: TaskContext, all: bool = False, provider: str | None = None,
          project: str | None = None, json: bool = False) -> None:
    """List the boxes rented through outrig: uptime, price, cost so far and their runs.

    Checked against each provider's own list: a box the provider no longer has is marked
    gone; one it has that outrig never recorded is shown as an orphan; a rent that outrig
    was killed in the middle of is matched up and shown. See docs/providers.md.

    Example:
        outrig boxes
    """
    from outrig.journal import Journal
    from outrig.providers.reconcile import boxes_lines, reconcile

    settings = settings_for(c, project)
    reporter = make_reporter(json)
    doc = reconcile(settings.project, Journal(), [provider] if provider else None)
    if json:
        reporter.emit_json(doc)
    else:
        reporter.lines(boxes_lines(doc, show_all=all))


@task(
    auto_shortflags=False,
    help={"box": "the rented box, as `outrig boxes` names it (its hosts/BOX.yaml); given "
                 "as a word: outrig release BOX",
          "force": "stop our runs on it first (when it answers), then release it",
          "project": PROJECT_HELP, "json": JSON_HELP},
)
@friendly
def release(c: TaskContext, box: str, force: bool = False, project: str | None = None,
            json: bool = False) -> None:
    """Terminate a box rented through outrig and remove its host file; print what it cost.

    Refused while a run of ours lives on it, unless --force. See docs/providers.md.

    Example:
        outrig release outrig-h100-1a2b
    """
    from outrig.ops.cleanup import stop_all_runs
    from outrig.providers.renting import release as release_box

    settings = settings_for(c, project)
    reporter = make_reporter(json)
    result = release_box(settings.project, box, force=force, stop_runs=stop_all_runs)
    if json:
        reporter.emit_json(result)
        return
    stopped = (f"; stopped {', '.join(result['stopped_runs'])}"
               if result["stopped_runs"] else "")
    price = float(result["price_per_hour"] or 0)
    reporter.success(f"released {box} ({result['provider']} {result['instance_id']}) after "
                     f"{result['uptime_s'] / 60:.1f} min at ${price:.2f}/h: "
                     f"${result['cost']:.2f}{stopped}")
