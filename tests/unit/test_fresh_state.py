"""Which state models restore may hand to a step without copying their input first
(tasks/fresh_state.py): validation must build every container of the result. Each model the
walk refuses is one whose validation does return a container of its input, so allowing it
would let a step change the claim's state in place."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

import pytest
from pydantic import (
    BaseModel,
    ConfigDict,
    PlainValidator,
    WrapValidator,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

from tasks.fresh_state import validation_copies


class Colour(Enum):
    RED = "red"


class Leaf(BaseModel):
    n: int = 0
    tags: list[str] = []


class Tree(BaseModel):
    name: str = ""
    kids: list[Tree] = []


class Pair(TypedDict):
    left: list[int]
    right: dict[str, int]


class Cat(BaseModel):
    kind: Literal["cat"] = "cat"
    toys: list[str] = []


class Dog(BaseModel):
    kind: Literal["dog"] = "dog"
    bones: dict[str, list[int]] = {}


class Fresh(BaseModel):
    leaves: list[Leaf] = []
    table: dict[str, list[int]] = {}
    maybe: Leaf | None = None
    either: int | list[str] = 0
    fixed: tuple[int, list[str]] = (0, [])
    colour: Colour = Colour.RED
    tree: Tree | None = None
    pair: Pair | None = None
    pet: Cat | Dog | None = None
    names: set[str] = set()

    @field_validator("leaves", mode="before")
    @classmethod
    def _before(cls, value: Any) -> Any:
        return value  # its output is validated (built) by list[Leaf] after it

    @field_validator("table", mode="after")
    @classmethod
    def _after(cls, value: Any) -> Any:
        return value  # sees only what validation built


FRESH_INPUT = {
    "leaves": [{"n": 1, "tags": ["a"]}], "table": {"k": [1, 2]}, "maybe": {"tags": ["b"]},
    "either": ["x"], "fixed": [1, ["y"]], "colour": "red",
    "tree": {"name": "root", "kids": [{"name": "kid", "kids": []}]},
    "pair": {"left": [1], "right": {"r": 2}}, "pet": {"kind": "dog", "bones": {"b": [3]}},
    "names": ["n"],
}


class AnyField(BaseModel):
    box: Any = None


class DictOfAny(BaseModel):
    box: dict[str, Any] = {}


class ListOfAny(BaseModel):
    box: list[Any] = []


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")


class Wrapped(BaseModel):
    box: Annotated[list[int], WrapValidator(lambda value, handler: value)] = []


class Plain(BaseModel):
    box: Annotated[list[int], PlainValidator(lambda value: value)] = []


class ModelWrap(BaseModel):
    box: list[int] = []

    @model_validator(mode="wrap")
    @classmethod
    def _wrap(cls, value: Any, handler: Any) -> Any:
        made = handler(value)
        if isinstance(value, dict):
            object.__setattr__(made, "box", value["box"])  # hands the input's list on
        return made


class Nested(BaseModel):
    inner: AnyField | None = None


def _containers(value: Any, found: list[Any]) -> list[Any]:
    """Every list, dict, set and model inside ``value``, itself included."""
    if isinstance(value, BaseModel):
        found.append(value)
        for item in value.__dict__.values():
            _containers(item, found)
        for item in (value.__pydantic_extra__ or {}).values():
            _containers(item, found)
    elif isinstance(value, dict):
        found.append(value)
        for item in value.values():
            _containers(item, found)
    elif isinstance(value, (list, tuple, set)):
        found.append(value)
        for item in value:
            _containers(item, found)
    return found


def _shared(model: type[BaseModel], data: dict[str, Any]) -> bool:
    """Whether ``model`` validated from ``data`` holds a container of ``data`` itself."""
    given = {id(c) for c in _containers(data, []) if not isinstance(c, tuple)}
    return any(id(c) in given for c in _containers(model.model_validate(data), []))


def test_fresh__a_model_of_lists_dicts_models_and_scalars_builds_every_container() -> None:
    assert validation_copies(Fresh)
    assert validation_copies(Tree)  # recursive: its definition refers to itself
    assert not _shared(Fresh, FRESH_INPUT)



@pytest.mark.parametrize(("model", "data"), [
    (AnyField, {"box": {"k": [1]}}),
    (DictOfAny, {"box": {"k": [1]}}),
    (ListOfAny, {"box": [[1]]}),
    (Extra, {"box": [1]}),
    (Wrapped, {"box": [1]}),
    (Plain, {"box": [1]}),
    (ModelWrap, {"box": [1]}),
    (Nested, {"inner": {"box": [1]}}),
], ids=lambda p: p.__name__ if isinstance(p, type) else "")
def test_fresh__a_model_that_passes_its_input_through_is_copied(
        model: type[BaseModel], data: dict[str, Any]) -> None:
    """Each of these hands the step a container of its input: restore must copy first."""
    assert _shared(model, data)
    assert not validation_copies(model)
