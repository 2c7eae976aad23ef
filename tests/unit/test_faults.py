"""Named fault points: the spec grammar, and how an armed point fires."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks import faults
from tasks.exceptions import FaultSpecError, InjectedFault
from tasks.faults import Fault


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("in_step:kill", Fault("in_step", None, "kill", False)),
        ("after_claim:exit:once", Fault("after_claim", None, "exit", True)),
        ("before_checkpoint_commit@draft:raise", Fault("before_checkpoint_commit", "draft",
                                                        "raise", False)),
        ("after_commit_before_publish@tick:kill:once",
         Fault("after_commit_before_publish", "tick", "kill", True)),
        ("in_step:sleep=1.5", Fault("in_step", None, "sleep", False, 1.5)),
        ("  in_step:stop  ", Fault("in_step", None, "stop", False)),
        ("in_step@:kill", Fault("in_step", None, "kill", False)),  # empty step: any step
        ("dispatcher_after_publish_before_mark:kill:once",
         Fault("dispatcher_after_publish_before_mark", None, "kill", True)),
    ],
)
def test_fault_parse__valid_specs(spec: str, expected: Fault) -> None:
    """``point[@step]:action[:once]`` parses into exactly the fault it names."""
    assert Fault.parse(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("in_step", "expected point"),
        ("", "expected point"),
        ("no_such_point:kill", "unknown point"),
        ("in_step:explode", "unknown action 'explode'"),
        ("in_step:sleep=abc", "in_step:sleep=abc"),
    ],
)
def test_fault_parse__invalid_specs_name_the_problem(spec: str, message: str) -> None:
    """A typo in ONWARD_FAULTS must fail loudly with an error naming the spec, never
    silently disarm a crash test or crash with a bare ValueError."""
    with pytest.raises(FaultSpecError, match=message):
        Fault.parse(spec)


def test_fault_parse__third_field_other_than_once_means_every_time() -> None:
    """Only the literal ``once`` limits a fault to one firing."""
    assert Fault.parse("in_step:raise:twice").once is False


@pytest.fixture()
def armed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Arm faults in this process for one test, and disarm them afterwards."""
    monkeypatch.setenv("ONWARD_FAULTS_DIR", str(tmp_path))
    yield tmp_path
    monkeypatch.delenv("ONWARD_FAULTS", raising=False)
    faults.arm_from_env()


def test_fault_point__disarmed_does_nothing(armed: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With ONWARD_FAULTS unset every point is a no-op."""
    monkeypatch.delenv("ONWARD_FAULTS", raising=False)
    faults.arm_from_env()
    for name in faults.POINTS:
        faults.point(name, "any")


def test_fault_point__step_filter_and_once(armed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``@step`` fault fires only for that step; ``once`` fires a single time across
    processes sharing the marker directory (one marker file is the proof)."""
    monkeypatch.setenv("ONWARD_FAULTS", "in_step@draft:raise:once,after_claim:raise")
    faults.arm_from_env()
    faults.point("in_step", "other_step")  # filtered out
    with pytest.raises(InjectedFault, match="in_step"):
        faults.point("in_step", "draft")
    faults.point("in_step", "draft")  # already fired once
    assert [p.name for p in armed.iterdir()] == ["in_step@draft.raise.fired"]
    for _ in range(2):  # no ``once``: fires every time
        with pytest.raises(InjectedFault, match="after_claim"):
            faults.point("after_claim", "anything")


def test_fault_point__bad_env_spec_fails_arming(armed: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A process started with a malformed ONWARD_FAULTS refuses to arm (and so to start)."""
    monkeypatch.setenv("ONWARD_FAULTS", "in_step:raise,no_such_point:kill")
    with pytest.raises(FaultSpecError, match="unknown point"):
        faults.arm_from_env()
