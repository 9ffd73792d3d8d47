"""The Claude call of a cited answer (seed stage 09), through ``claude-agent-sdk``.

Contract: ``run`` sends a draft's prompt to Claude through ``claude_agent_sdk.query`` with the
seed's pinned options (no tools, one turn, no setting sources, strict MCP config, a budget cap)
and checks the answer with ``citations.check``; a refused draft returns the refusal without a
call. ``claude_credentials`` names the credential variable found, or None. Our machines cannot
reach Claude: tests pass a scripted ``query_fn``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os

from retrieval_assets.answers.citations import REFUSAL, check
from retrieval_assets.types import Answer, Draft

MODEL = "claude-opus-5-5"
# The seed's pinned options for the Claude call; the names are ClaudeAgentOptions fields.
# tools=[] disables every built-in tool, setting_sources=[] loads no settings file (no hooks,
# no CLAUDE.md), strict_mcp_config=True keeps the user's own MCP servers out of the call.
CLAUDE_OPTIONS = {
    "tools": [],
    "max_turns": 1,
    "setting_sources": [],
    "max_budget_usd": 0.05,
    "strict_mcp_config": True,
}

# Environment variables that give the Claude Code CLI credentials: an API key, an OAuth token
# (`claude setup-token`), or a cloud provider switch. RETRIEVAL_CLAUDE_AUTH=login declares a
# `claude login` session stored by the CLI itself (we do not read its credential files).
CREDENTIAL_VARIABLES = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX")
LOGIN_VARIABLE = "RETRIEVAL_CLAUDE_AUTH"


class ClaudeError(RuntimeError):
    """The Claude call returned an error result or an error message."""


def claude_credentials() -> str | None:
    """The name of the first credential variable set for the Claude Code CLI, else None."""
    for name in CREDENTIAL_VARIABLES:
        if os.environ.get(name, "").strip():
            return name
    if os.environ.get(LOGIN_VARIABLE, "").strip().lower() == "login":
        return LOGIN_VARIABLE
    return None


def claude_options(model: str | None = None, budget_usd: float | None = None):
    """``ClaudeAgentOptions`` with the pinned options, ``model`` (default claude-opus-5-5) and the call's
    cost cap (default the pinned 0.05 USD).

    ``verbatim_prompts`` is set too: the prompt carries corpus text, and an ``@/path`` inside a
    chunk must not make Claude Code read a local file.
    """
    try:
        from claude_agent_sdk import ClaudeAgentOptions
    except ImportError as exc:
        raise RuntimeError(f"claude-agent-sdk is needed for Claude answers ({exc}): run `uv sync --extra claude`") from exc
    pinned = {**CLAUDE_OPTIONS, **({"max_budget_usd": budget_usd} if budget_usd is not None else {})}
    return ClaudeAgentOptions(**pinned, model=model or MODEL, verbatim_prompts=True)


async def _collect(query_fn, prompt: str, options) -> tuple[str, float]:
    texts: list[str] = []
    cost = 0.0
    stream = query_fn(prompt=prompt, options=options)

    def take(message) -> None:
        nonlocal cost
        if hasattr(message, "total_cost_usd"):  # ResultMessage
            cost = float(message.total_cost_usd or 0.0)
            if getattr(message, "is_error", False):
                detail = "; ".join(getattr(message, "errors", None) or []) or getattr(message, "result", None) or ""
                raise ClaudeError(f"Claude returned an error result ({message.subtype}, ${cost:.4f} spent){': ' + detail if detail else ''}")
        elif hasattr(message, "content") and hasattr(message, "model"):  # AssistantMessage
            if getattr(message, "error", None):
                raise ClaudeError(f"Claude returned an error message: {message.error}")
            texts.extend(block.text for block in message.content if isinstance(getattr(block, "text", None), str))

    if hasattr(stream, "__aiter__"):
        async for message in stream:
            take(message)
    else:  # a plain iterable of messages (simple fakes)
        for message in stream:
            take(message)
    return "\n".join(t.strip() for t in texts if t.strip()), cost


def _run_async(coro):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from inside an event loop
        return pool.submit(asyncio.run, coro).result()


def ask(prompt: str, *, query_fn=None, model: str | None = None, budget_usd: float | None = None) -> tuple[str, float]:
    """Claude's text reply to ``prompt`` under the pinned options, and the call's cost in USD; ``ClaudeError``
    on an error result or message. ``query_fn`` replaces ``claude_agent_sdk.query`` (see ``run``)."""
    options = claude_options(model, budget_usd)
    if query_fn is None:
        from claude_agent_sdk import query as query_fn
    return _run_async(_collect(query_fn, prompt, options))


def run(query: str, draft: Draft, *, query_fn=None, model: str | None = None) -> Answer:
    """Claude's answer to the draft's prompt, checked; the refusal (no call, cost 0) for a refused draft.

    ``query_fn`` replaces ``claude_agent_sdk.query`` (same call: ``prompt=``, ``options=``;
    yields message objects); text comes from the assistant messages' text blocks and the cost
    from the result message's ``total_cost_usd``.
    """
    if draft.refused:
        return Answer(REFUSAL, check(REFUSAL, ()), 0.0)
    try:
        text, cost = ask(draft.prompt, query_fn=query_fn, model=model)
    except ClaudeError as exc:
        raise ClaudeError(f"question {query!r}: {exc}") from None
    return Answer(text, check(text, draft.citations), cost)
