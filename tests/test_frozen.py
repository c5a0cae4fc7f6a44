"""``builder``: a frozen dataclass made through its mutable twin is the object ``cls(...)`` gives."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from ctrlrun._frozen import builder
from ctrlrun.action import Action, Principal, new_action
from ctrlrun.effects.records import EffectRecord, EffectState, new_record


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    items: list[int] = field(default_factory=list)
    count: int = 3
    derived: str = field(default="", init=False)


def test_a_built_object_is_the_class_frozen_and_equal() -> None:
    build = builder(Sample)
    made = build("a", [1], count=4)
    assert type(made) is Sample and made == Sample("a", [1], count=4)
    assert build("b").items == [] and build("b").items is not build("b").items
    assert made.derived == "" and repr(made) == repr(Sample("a", [1], count=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "z"  # type: ignore[misc]
    assert dataclasses.replace(made, count=5).count == 5
    assert pickle.loads(pickle.dumps(made)) == made and copy.deepcopy(made) == made


def test_a_class_without_slots_is_refused() -> None:
    @dataclass(frozen=True)
    class Plain:
        name: str

    with pytest.raises(TypeError, match="slots"):
        builder(Plain)


def test_the_call_paths_records_and_actions_equal_the_classes() -> None:
    from ctrlrun._time import utc_now

    now = utc_now()
    args = ("k", EffectState.EXECUTING, "act_1", 1, now, now, now)
    assert new_record(*args) == EffectRecord(*args) and type(new_record(*args)) is EffectRecord
    principal = Principal("agent-1", "u")
    fast = new_action("a.b", {"x": 1}, principal, "r/1", "production")
    slow = Action("a.b", {"x": 1}, principal, "r/1", environment="production")
    assert type(fast) is Action and fast.action_id != slow.action_id
    assert (fast._canonical, fast.action_hash, dict(fast.arguments)) == (
        slow._canonical, slow.action_hash, dict(slow.arguments)
    )
    with pytest.raises(Exception, match="action name"):
        new_action("", {}, principal, None, "production")  # checked as Action() checks
