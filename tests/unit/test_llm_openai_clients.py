"""``OpenAIChat(clients=N)`` / ``AsyncOpenAIChat(clients=N)``: calls spread over N SDK
clients (N connection pools), in turn. The SDK is the outside world here: ``openai.OpenAI``
and ``openai.AsyncOpenAI`` are replaced by recording stand-ins that answer a chat completion.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, ClassVar

import openai
import pytest

from tasks.llm_openai import AsyncOpenAIChat, OpenAIChat

ANSWER = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "hi"}}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class _Answer:
    def model_dump(self, **_: Any) -> dict[str, Any]:
        return ANSWER


class FakeSDK:
    built: ClassVar[list[FakeSDK]] = []

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.calls = 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        FakeSDK.built.append(self)

    def create(self, **_: Any) -> _Answer:
        self.calls += 1
        return _Answer()


class FakeAsyncSDK(FakeSDK):
    async def create(self, **_: Any) -> _Answer:  # type: ignore[override]
        self.calls += 1
        return _Answer()


@pytest.fixture(autouse=True)
def fake_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeSDK.built = []
    monkeypatch.setattr(openai, "OpenAI", FakeSDK)
    monkeypatch.setattr(openai, "AsyncOpenAI", FakeAsyncSDK)


def test_openai_chat__calls_take_the_sdk_clients_in_turn() -> None:
    chat = OpenAIChat(api_key="k", base_url="http://model", clients=3)

    answers = [chat.complete(model="m", messages=[]) for _ in range(6)]

    assert [sdk.calls for sdk in FakeSDK.built] == [2, 2, 2]
    assert all(sdk.options == {"api_key": "k", "base_url": "http://model"}
               for sdk in FakeSDK.built)
    assert {answer.text for answer in answers} == {"hi"}


def test_openai_chat__one_client_by_default() -> None:
    chat = OpenAIChat(api_key="k")

    chat.complete(model="m", messages=[])
    chat.complete(model="m", messages=[])

    assert [sdk.calls for sdk in FakeSDK.built] == [2]
    assert chat.client is FakeSDK.built[0]


def test_async_openai_chat__calls_take_the_loop_s_sdk_clients_in_turn() -> None:
    chat = AsyncOpenAIChat(api_key="k", clients=2)

    async def four() -> None:
        await asyncio.gather(*(chat.complete(model="m", messages=[]) for _ in range(4)))

    asyncio.run(four())

    assert [sdk.calls for sdk in FakeSDK.built] == [2, 2]


@pytest.mark.parametrize("adapter", [OpenAIChat, AsyncOpenAIChat])
def test_clients__refused_below_one_or_beside_a_given_client(adapter: Any) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        adapter(api_key="k", clients=0)
    with pytest.raises(ValueError, match="not both"):
        adapter(FakeSDK(), clients=2)
