"""The conversation's plain data types, for the UI modules that name them from here (they live
in app/services/conversation.py, where the Qt-free chat session uses them)."""

from app.services.conversation import (
    AnswerFormat,
    Conversation,
    Message,
    MessageState,
    Role,
    Sends,
    ToolCallView,
    ToolDecision,
    ToolProgress,
    ToolStatus,
)

__all__ = [
    "AnswerFormat",
    "Conversation",
    "Message",
    "MessageState",
    "Role",
    "Sends",
    "ToolCallView",
    "ToolDecision",
    "ToolProgress",
    "ToolStatus",
]
