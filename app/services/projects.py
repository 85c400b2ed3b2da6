"""What a new chat in a project starts with: the project's system prompt and document
collections, applied to the chat settings the conversation is created with.

Only new chats take them: a chat moved into a project keeps its own settings, and editing a
project does not rewrite the chats already in it (they may have been changed by hand since).
"""

from __future__ import annotations

from app.services.chat_settings import ChatSettings
from app.services.chat_store import DEFAULT_TITLE, ChatStore, Project, StoredConversation


def project_settings(project: Project, base: ChatSettings | None = None) -> ChatSettings:
    """`base` (the defaults for none) with the project's system prompt and collections; an
    empty project prompt leaves the base's prompt as it is."""
    settings = base or ChatSettings()
    return settings.replace(
        system_prompt=project.system_prompt or settings.system_prompt,
        collections=tuple(project.collections),
    )


def new_chat_in_project(
    store: ChatStore, project_id: int, base: ChatSettings | None = None
) -> StoredConversation:
    """A new, empty conversation in the project, its settings the project's. A chat of the
    project still untitled and without a message is taken again (its settings renewed)
    rather than a second empty one piling up under the project."""
    settings = project_settings(store.project(project_id), base).to_stored()
    for conv in store.conversations():
        if (
            conv.project_id == project_id
            and conv.title == DEFAULT_TITLE
            and conv.active_leaf_id is None
            and not store.messages(conv.id)
        ):
            store.replace_settings(conv.id, settings)
            return store.conversation(conv.id)
    return store.create_in_project(project_id, settings)


__all__ = ["new_chat_in_project", "project_settings"]
