"""The HTTP API's request and response shapes as pydantic models, one module per dialect:
`openai` (chat and text completions), `embeddings` (embeddings and rerank), `ollama`,
`responses` (OpenAI's Responses API) and `anthropic` (Messages), on the pieces they share
(`base`; `messages` for the OpenAI and Ollama chat; `agent` for the last two) and the server's
own routes (`hosting`) and llama-server's (`llama`: its extensions of the chat, its error;
`llama_utility`: /tokenize, /detokenize, /apply-template, /props). Nothing is re-exported
here: import a model from its dialect's module.

Every route reads its body with `parse.parse_body`, which checks it against the route's model
and turns the first problem into a one-line 400 naming the field (`'temperature' must be
between 0 and 2`), and works from the typed object. Chat messages and tools come out
OpenAI-shaped (`chat_messages`, `chat_tools`) whatever the dialect, as `chat_reply.plan_chat`
and the tool formats take them. `openapi.py` documents the API from the same models.

A key a body model does not declare is a 400 naming it (`body_model.Body`), but for the few
that official clients send and that change nothing (`body_model.IGNORED`, the one list). Models
are strict, as the routes always were: JSON's true is not a number, 1.0 is not a whole number,
"1" is not 1. Fields of an API that the server cannot honour are declared and refused by name
when they ask for something (`body_model.NotHonoured`).

The document must promise no refusal the server does not make: the fuzz test sends bodies the
schema calls invalid and expects a 4xx. Rules across fields (a tool_choice needs its tools) are
told in descriptions, not keywords; a custom check's schema is never narrower than what it lets
through.
"""
