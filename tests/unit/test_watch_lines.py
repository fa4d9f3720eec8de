"""What ``watch`` says on its own: the heartbeat line (what is known of the run, and how long
ago the box answered) and failure hints that fit the playbook (a resume from a checkpoint is
promised only when a process declares ``checkpoints:``)."""

from __future__ import annotations

from outrig.watching.lines import crash_hint, death_hint, heartbeat_line

RECORD = {"host": "sandbox", "run_id": "hello-1", "playbook": "hello"}


def test_a_heartbeat_of_a_run_without_metrics_shows_its_state_and_the_last_answer() -> None:
    line = heartbeat_line("sandbox", "hello-1", {"state": "running", "step": None},
                          last_answer=100.0, now=112.4)
    assert line == "  sandbox hello-1: running · the box answered 12s ago"


def test_a_heartbeat_shows_step_loss_and_eta_where_known() -> None:
    line = heartbeat_line("a", "r", {"state": "running", "step": 40, "epoch": 1,
                                     "loss": 0.523456, "eta_s": 180.0}, 5.0, 7.0)
    assert line == "  a r: running, step 40, epoch 1, loss 0.5235, ETA 3m · the box answered 2s ago"


def test_a_heartbeat_before_the_first_answer_says_so() -> None:
    line = heartbeat_line("a", "r", {}, None, 7.0)
    assert line == "  a r: waiting for the first answer · no answer from the box yet"


def test_the_hints_of_a_playbook_without_checkpoints_talk_of_none() -> None:
    crash = crash_hint(RECORD, "beat exited with 1", 0, 0, checkpointed=False)
    dead = death_hint(RECORD, "sandbox", "hello-1", "no answer for 60s", [], False)
    for text in (crash, dead):
        assert "checkpoint" not in text and "trainer" not in text, text
    assert "outrig deploy --host sandbox --playbook hello" in crash
    assert "--restarts N" in crash
    assert "outrig deploy --host NEW --playbook hello" in dead and "migrate" not in dead


def test_the_hints_of_a_playbook_with_checkpoints_offer_the_resume() -> None:
    crash = crash_hint(RECORD, "trainer exited with 1", 1, 1, checkpointed=True)
    dead = death_hint(RECORD, "sandbox", "hello-1", "no answer", ["b: its workdir is not "
                                                                 "writable"], True)
    assert "newest complete one" in crash and "used 1 of 1 restart(s)" in crash
    assert "outrig migrate --run hello-1 --to NEW" in dead and "checkpoint" in dead
    assert "b: its workdir is not writable" in dead
