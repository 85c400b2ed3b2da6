"""The chat's active reply and its states, for the UI modules and tests that name them from
here (they live in app/services/chat_reply.py, with the Qt-free chat session)."""

from app.services.chat_reply import ActiveReply, Parent, ReplyState

__all__ = ["ActiveReply", "Parent", "ReplyState"]
