"""The peer's graph (LangGraph), copied into the peer's own project folder and served there.

Equivalent to the coxswain script the bench sends: ``target`` tool rounds of 5 ms each and no
LLM. The first node logs the run's start and the last its end (``time.time()``, the same clock
as the bench and Redis), into the thread's state through an append reducer.
"""

import asyncio
import operator
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

TOOL_S = 0.005


class State(TypedDict, total=False):
    marker: str
    rounds: int
    target: int
    log: Annotated[list[dict[str, Any]], operator.add]


async def agent(state: State) -> dict[str, Any]:
    rounds, target = state.get("rounds") or 0, state.get("target") or 3
    if rounds == 0:
        return {"log": [{"marker": state.get("marker"), "ev": "start", "t": time.time()}]}
    if rounds >= target:
        return {"log": [{"marker": state.get("marker"), "ev": "end", "t": time.time()}]}
    return {}


def route(state: State) -> str:
    return "tools" if (state.get("rounds") or 0) < (state.get("target") or 3) else END


async def tools(state: State) -> dict[str, Any]:
    await asyncio.sleep(TOOL_S)
    return {"rounds": (state.get("rounds") or 0) + 1}


builder = StateGraph(State)
builder.add_node("agent", agent)
builder.add_node("tools", tools)
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route, ["tools", END])
builder.add_edge("tools", "agent")
graph = builder.compile()
