"""What the chat tells the user about the window, in their words.

The status line after a turn, ``/budget``, the check that a prompt fits
before it is sent, and the refusal of a window the reserve fills: each names
the flag that changes the outcome, never a Python method.
"""

from __future__ import annotations

from decimal import Decimal

from threadline import Conversation, Message, Model, Role, RunResult
from threadline._result import RoundRecord
from threadline.cli._errors import CliError
from threadline.limiting import Budget, DroppedUnit

# The budget rules live in the limiting room; the CLI resolves them as a turn will.
from threadline.limiting._budget import resolve_budget

__all__ = [
    "budget_of",
    "budget_words",
    "check_prompt_fits",
    "check_window",
    "count_words",
    "dropped_words",
    "gap_words",
    "status_line",
]

_KEEP_ROOM = "raise --max-context-tokens or lower --reserve / --max-output-tokens"


def budget_of(conversation: Conversation) -> Budget | None:
    """The prompt budget the conversation's next turn will have (``None``: no limit).

    Raises:
        InvalidRequestError: the answer's reserve fills an explicit limit.
    """
    agent = conversation.agent
    return resolve_budget(
        agent.model,
        max_context_tokens=conversation.max_context_tokens,
        output_reserve_tokens=conversation.output_reserve_tokens,
        max_output_tokens=agent.max_output_tokens,
    ).budget


def check_window(conversation: Conversation) -> Budget | None:
    """:func:`budget_of`, refusing a window the answer's reserve fills, in the flags' words."""
    agent = conversation.agent
    reserve = conversation.output_reserve_tokens
    kept = reserve if isinstance(reserve, int) else agent.max_output_tokens or 4096
    window = conversation.max_context_tokens
    where = f"--max-context-tokens {window}"
    if window is None and agent.model is not None and agent.model.context_size is not None:
        window = agent.model.context_size
        where = f"the model's window of {window:,} tokens"
    if window is not None and kept >= window:
        raise CliError(
            f"{where} leaves no room for the prompt: {kept:,} tokens are kept for "
            f"the answer; {_KEEP_ROOM}"
        )
    return budget_of(conversation)


def check_prompt_fits(conversation: Conversation, prompt: str, budget: Budget | None) -> None:
    """Refuse a prompt whose pinned part alone (instructions and prompt) is over the budget.

    Nothing could be dropped to make it fit, so sending it would only fail at the provider.
    """
    if budget is None:
        return
    agent = conversation.agent
    pinned = [Message.user(prompt)]
    if agent.instructions is not None:
        pinned.insert(0, Message.system(agent.instructions))
    tokens = agent.resolved_token_counter().count(pinned, agent.tools)
    if tokens <= budget.prompt_tokens:
        return
    what = "your prompt and the instructions are" if agent.instructions else "your prompt is"
    raise CliError(
        f"{what} {tokens:,} tokens; this window allows {budget.prompt_tokens:,} "
        f"({budget.limit:,} less {budget.reserve:,} kept for the answer): shorten it, or "
        f"{_KEEP_ROOM}"
    )


def budget_words(conversation: Conversation, last: RunResult | None = None) -> str:
    """``/budget``: what the history takes and what is left, or by how much it is over;
    with the ``last`` turn's result, how far its estimate was from the server's count."""
    estimate = conversation.token_estimate()
    budget = budget_of(conversation)
    taken = f"history and instructions: {estimate:,} tokens"
    gap = gap_words(last.rounds[-1]) if last is not None and last.rounds else None
    after = "" if gap is None else f"\n{gap}"
    if last is not None and any(step.limited for step in last.limiting):
        after += f"\nlast turn's limiting: {last.limiting_summary()}"
    if last is not None:
        after += "".join(
            f"\nround {record.round}: {record.cache}" for record in last.rounds if record.cache
        )
    if budget is None:
        return f"{taken}; no budget: the window is unknown, set --max-context-tokens{after}"
    left = budget.prompt_tokens - estimate
    if left < 0:
        return (
            f"{taken}; over the {budget.prompt_tokens:,}-token budget by {-left:,} tokens; "
            f"the oldest turns will be dropped{after}"
        )
    return (
        f"{taken}; {left:,} of the {budget.prompt_tokens:,}-token budget left "
        f"({budget.reserve:,} more kept for the answer){after}"
    )


def _percent(decided: int, reported: int) -> str:
    return f"{(reported - decided) / decided:+.1%}" if decided else "n/a"


def count_words(record: RoundRecord) -> str:
    """What a round sent: ``sent 1,264`` when threadline's count and the server's agree
    (or the server said nothing), else ``estimate 1,210 · server 1,264 (+4.5%)``
    (``exact 1,262 · …`` when the server's own tokenizer counted it beforehand)."""
    decided, reported = record.decided_input_tokens, record.reported_input_tokens
    if reported is None:
        return f"sent {decided:,}"
    if reported == decided:
        return f"sent {decided:,}"
    which = "estimate" if record.exact_input_tokens is None else "exact"
    return f"{which} {decided:,} · server {reported:,} ({_percent(decided, reported)})"


def gap_words(record: RoundRecord) -> str | None:
    """``/budget``'s account of the last round's counts: which count decided what was
    kept, and how far it was from the server's. ``None`` when the server said nothing."""
    reported = record.reported_input_tokens
    if reported is None:
        return None
    raw = record.estimated_input_tokens
    lines = [f"last turn: the server counted {reported:,} tokens sent"]
    if record.exact_input_tokens is not None:
        lines.append(
            f"threadline asked the server for the exact count: "
            f"{record.exact_input_tokens:,}; its own estimate was {raw:,} "
            f"({_percent(raw, record.exact_input_tokens)} off)"
        )
    elif record.calibrated_input_tokens is not None:
        calibrated = record.calibrated_input_tokens
        lines.append(
            f"threadline estimated {raw:,} with its own tokenizer (o200k_base) and scaled it "
            f"to {calibrated:,} with what earlier turns taught it; "
            f"the server's count is {_percent(calibrated, reported)} from that"
        )
    else:
        lines.append(
            f"threadline estimated {raw:,} with its own tokenizer, which is not necessarily "
            f"the model's; the server's count is {_percent(raw, reported)} from that"
        )
    lines.append(
        "the estimate decides what is dropped; near the budget, and until a model's first "
        "report, a server that can count (llama.cpp, Anthropic) is asked for the exact "
        "count first"
    )
    return "\n".join(lines)


def dropped_words(dropped: list[DroppedUnit]) -> str:
    """What limiting dropped, in turns: "dropped the 2 oldest turns (4 messages)"."""
    if not dropped:
        return "nothing dropped"
    turns = sum(1 for unit in dropped if unit.roles and unit.roles[0] is Role.USER)
    messages = sum(len(unit.roles) for unit in dropped)
    noun = "message" if messages == 1 else "messages"
    if turns == 0:
        return f"dropped {messages} old {noun}"
    which = "the oldest turn" if turns == 1 else f"the {turns} oldest turns"
    return f"dropped {which} ({messages} {noun})"


def _cost_words(cost: Decimal | None) -> str | None:
    if cost is None:
        return None
    if cost == 0:
        return "$0"
    return f"${cost:.2g}" if cost < Decimal("0.01") else f"${cost:.2f}"


def status_line(
    result: RunResult, conversation: Conversation, *, model: Model, url: str | None
) -> str:
    """After a turn: tokens sent against the budget, the reserve, what was dropped, the cost."""
    last = result.rounds[-1]
    server = ""
    if last.reported_input_tokens == last.decided_input_tokens:
        server = f" (server: {last.reported_input_tokens:,})"
    sent = count_words(last)
    parts: list[str] = []
    if result.budget is None:
        parts.append(
            f"{sent} tokens{server} · no limit: the window is unknown (--max-context-tokens)"
        )
    else:
        parts.append(f"{sent} of {result.budget.prompt_tokens:,} budget tokens{server}")
        parts.append(f"{result.budget.reserve:,} kept for the answer")
    parts.append(dropped_words([unit for step in result.limiting for unit in step.dropped]))
    if result.response.finish_reason == "length":
        parts.append("answer cut at its length limit (--max-output-tokens)")
    cost = _cost_words(model.cost(result.usage, api_url=url) if url else None)
    if cost is not None:
        parts.append(cost)
    turns = conversation.turn_count()
    parts.append(f"{turns} turn" if turns == 1 else f"{turns} turns")
    return "[" + " · ".join(parts) + "]"
