"""The reasoning budget's state on the decode thread: which tokens it counts as thinking, when
it forces the close marker's tokens, and that it never cuts a character in two."""

from __future__ import annotations

from engine.decoding.reasoning import ThinkMarkers
from engine.decoding.thinking_budget import BudgetKeeper, ThinkingBudget

CLOSE = [901, 902, 903]  # the close's tokens, as a vocabulary would give them


def run(keeper: BudgetKeeper, pieces: list[bytes]) -> list[int | str]:
    """Feed the pieces as a model would write them, a forced token in place of the next
    piece whenever the keeper forces one; what the reply took, in order."""
    took: list[int | str] = []
    queue = list(pieces)
    while queue or keeper.forced() is not None:
        forced = keeper.forced()
        if forced is not None:
            keeper.accept(forced, b"<forced>")
            took.append(forced)
            continue
        piece = queue.pop(0)
        keeper.accept(0, piece)
        took.append(piece.decode("utf-8", "replace"))
    return took


def test_counts_from_the_prompts_open_block_and_forces_the_close() -> None:
    keeper = BudgetKeeper(ThinkingBudget(3, ThinkMarkers(), in_thinking=True), CLOSE)
    took = run(keeper, [b"a", b"b", b"c", b"d", b"e"])
    assert took == ["a", "b", "c", *CLOSE, "d", "e"]
    assert keeper.counted == 3 and keeper.forced_count == 3 and keeper.state == "done"


def test_counts_after_the_open_marker_the_model_writes() -> None:
    keeper = BudgetKeeper(ThinkingBudget(2, ThinkMarkers()), CLOSE)
    took = run(keeper, [b" <th", b"ink>", b"x", b"y", b"z"])
    assert took == [" <th", "ink>", "x", "y", *CLOSE, "z"]


def test_a_block_closed_within_the_budget_is_left_alone() -> None:
    keeper = BudgetKeeper(ThinkingBudget(5, ThinkMarkers(), in_thinking=True), CLOSE)
    took = run(keeper, [b"a", b"</th", b"ink>", b"b", b"c", b"d", b"e", b"f"])
    assert all(isinstance(t, str) for t in took) and keeper.state == "done"


def test_a_reply_that_does_not_open_a_block_is_never_forced() -> None:
    keeper = BudgetKeeper(ThinkingBudget(0, ThinkMarkers()), CLOSE)
    took = run(keeper, [b"Hello", b" <think>", b"x"])
    assert took == ["Hello", " <think>", "x"] and keeper.state == "done"


def test_budget_zero_forces_the_close_first() -> None:
    keeper = BudgetKeeper(ThinkingBudget(0, ThinkMarkers(), in_thinking=True), CLOSE)
    assert run(keeper, [b"a"]) == [*CLOSE, "a"]


def test_forcing_waits_for_a_whole_character() -> None:
    keeper = BudgetKeeper(ThinkingBudget(1, ThinkMarkers(), in_thinking=True), CLOSE)
    euro = "€".encode()  # three bytes, written as two pieces
    took = run(keeper, [euro[:2], euro[2:], b"after"])
    assert took[2:5] == CLOSE and keeper.counted == 2


def test_other_markers() -> None:
    markers = ThinkMarkers("[THINK]", "[/THINK]")
    budget = ThinkingBudget(1, markers)
    assert budget.forced_text == "\n[/THINK]\n\n"
    keeper = BudgetKeeper(budget, CLOSE)
    assert run(keeper, [b"[THINK]", b"a", b"b"]) == ["[THINK]", "a", *CLOSE, "b"]


def test_the_message_goes_before_the_close() -> None:
    budget = ThinkingBudget(4, ThinkMarkers(), message=" Enough.")
    assert budget.forced_text == " Enough.\n</think>\n\n"
