"""Conversations as token ids: one rendering shared by engines, ``buffer ingest`` and the ``serve`` endpoint.

Messages are OpenAI-style dicts: ``role`` (system, developer, user, assistant, tool), ``content`` (a string, a
list of ``{"type": "text", "text": ...}`` parts, or null for an assistant turn that only calls tools), and for
assistants optionally ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments"}}]``),
for tools ``tool_call_id``.

Rendering: the tokenizer's chat template when it has one (``tools`` passed through), else the project's plain
format, one block per message: ``<|role|>\\n`` + text + EOS, where an assistant's tool calls follow its text as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` lines (Hermes style), and the generation prompt is
``<|assistant|>\\n``.

Training layout (``split_conversation``): the messages before the first assistant turn are the prompt;
everything after is the response, and only the tokens an assistant produced (its text, tool calls and closing
EOS) have ``action_mask`` true. The role headers and the other roles' messages are context, masked out.

With a chat template, tool-call arguments reach the template as objects (what Hugging Face templates expect),
and a template's own refusal (``raise_exception``) becomes a ChatFormatError.

Departure with chat templates: each message's tokens are the template's text for that message, tokenised on
its own (the difference between the rendered conversation with and without it). Token boundaries at the seams
can differ from tokenising the whole text at once; the trajectory is still exactly what is trained and, in a
``serve`` session, exactly what the model was given.
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatFormatError(ValueError):
    """A conversation that cannot be rendered; the message says what is wrong."""


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatFormatError(f"{where}: content parts must be {{\"type\": \"text\", \"text\": \"...\"}} "
                                      "(only text is supported)")
            parts.append(part["text"])
        return "".join(parts)
    raise ChatFormatError(f"{where}: content must be a string, a list of text parts, or null")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ChatFormatError(f"{where}: tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatFormatError(f"{where}: tool_calls[{j}] needs function.name (a string)")
        args = fn.get("arguments", "{}")
        if not isinstance(args, (str, dict)):
            raise ChatFormatError(f"{where}: tool_calls[{j}].function.arguments must be a JSON string or object")
        out.append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated plain copies of ``messages`` (``content`` always a string); ChatFormatError naming the bad
    message otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatFormatError(f"{where} must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise ChatFormatError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
        if "content" not in m and not m.get("tool_calls"):
            raise ChatFormatError(f"{where} needs a content")
        msg: dict[str, Any] = {"role": role, "content": _text_of(m.get("content"), where)}
        if m.get("tool_calls"):
            if role != "assistant":
                raise ChatFormatError(f"{where}: only assistant messages carry tool_calls")
            msg["tool_calls"] = _tool_calls(m["tool_calls"], where)
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def message_text(m: dict[str, Any]) -> str:
    """A message's body in the plain format: its text, then one ``<tool_call>`` line per tool call."""
    text = m.get("content") or ""
    for call in m.get("tool_calls") or ():
        fn = call["function"]
        try:
            args = json.loads(fn["arguments"])
        except (TypeError, json.JSONDecodeError):
            args = fn["arguments"]
        line = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
        text += ("\n" if text else "") + f"<tool_call>{line}</tool_call>"
    return text


_TURN_PROBE = "Turn-end probe 7351"


def turn_end_ids(tokenizer) -> list[int]:
    """The special token that closes an assistant turn in ``tokenizer``'s chat template (Qwen2.5's
    ``<|im_end|>``, Llama 3's ``<|eot_id|>``), as a one-element list; empty without a template, or where the
    template ends a turn with plain text (no engine can stop at it as a token) or with EOS alone. A base model
    run under a chat template ends its turns with it although its EOS is another token (Qwen2.5 base: EOS
    ``<|endoftext|>``): an engine that stopped at EOS alone would run every response to its length limit."""
    if not _has_template(tokenizer):
        return []
    text = _template_text(tokenizer, [{"role": "user", "content": "1+1="},
                                      {"role": "assistant", "content": _TURN_PROBE}], False, None)
    at = text.rfind(_TURN_PROBE)
    after = _encode(tokenizer, text[at + len(_TURN_PROBE):]) if at >= 0 else []
    special = {int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    special |= {int(i) for i in tokenizer.all_special_ids}
    return after[:1] if after and after[0] in special else []


def _has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _for_template(m: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates read it: tool-call arguments as an object, not OpenAI's JSON string. The
    common templates (Qwen2.5, Llama 3.1, ...) write ``arguments | tojson``, which would quote the string."""
    if not m.get("tool_calls"):
        return m
    calls = []
    for call in m["tool_calls"]:
        args = call["function"]["arguments"]
        try:
            parsed = json.loads(args)
        except (TypeError, json.JSONDecodeError):
            parsed = args
        calls.append({**call, "function": {**call["function"],
                                           "arguments": parsed if isinstance(parsed, dict) else args}})
    return {**m, "tool_calls": calls}


def _template_text(tokenizer, messages, add_generation_prompt: bool, tools, chat_template: str | None = None,
                   continue_final: bool = False, enable_thinking: bool | None = None) -> str:
    from jinja2 import TemplateError

    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    if chat_template:
        kwargs["chat_template"] = chat_template
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if continue_final:
        kwargs["continue_final_message"] = True
    try:
        return tokenizer.apply_chat_template([_for_template(m) for m in messages],
                                             add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs)
    except TemplateError as e:  # templates refuse shapes they do not support (raise_exception in the template)
        whose = "the task set's chat template" if chat_template else "the tokenizer's chat template"
        raise ChatFormatError(f"{whose} refuses this conversation: {e}") from None
    except ValueError as e:  # continue_final_message on a template that does not render the message's text as is
        raise ChatFormatError(f"cannot continue the final assistant message (a reply prefix): {e}") from None


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _plain_header(tokenizer, role: str) -> list[int]:
    return _encode(tokenizer, f"<|{role}|>\n")


def _plain_body(tokenizer, m: dict[str, Any]) -> list[int]:
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return _encode(tokenizer, message_text(m)) + eos


def _plain_tools(tokenizer, tools) -> list[int]:
    """Without a chat template, offered tools go first, as a system block listing their JSON schemas."""
    if not tools:
        return []
    return _plain_header(tokenizer, "system") + _plain_body(
        tokenizer, {"content": "Tools:\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)})


def render_ids(messages: list[dict[str, Any]], tokenizer, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> list[int]:
    """Token ids of a whole conversation (normalised messages), with the generation prompt if asked."""
    if _has_template(tokenizer):
        return _encode(tokenizer, _template_text(tokenizer, messages, add_generation_prompt, tools))
    ids = _plain_tools(tokenizer, tools)
    for m in messages:
        ids += _plain_header(tokenizer, m["role"]) + _plain_body(tokenizer, m)
    if add_generation_prompt:
        ids += _plain_header(tokenizer, "assistant")
    return ids


def render_prompt_ids(messages: list[dict[str, Any]], tokenizer, chat_template: str | None = None,
                      enable_thinking: bool | None = None, tools: list[dict] | None = None) -> list[int]:
    """The token ids of a prompt (normalised messages) as Trinity-RFT renders one for generation
    (``BaseInferenceModel.apply_chat_template``): with ``chat_template`` (a Jinja template in place of the
    tokenizer's) or the tokenizer's template, ``add_generation_prompt`` and ``enable_thinking`` (when not None);
    a conversation that ends with an assistant message (a reply prefix, ``format.reply_prefix``) is continued
    instead: that message stays open (``continue_final_message``, no end of turn) and the model writes on from its
    text. Without any template, the plain format: the final assistant message's header and text, no EOS."""
    continue_final = bool(messages) and messages[-1]["role"] == "assistant"
    if chat_template or _has_template(tokenizer):
        text = _template_text(tokenizer, messages, not continue_final, tools, chat_template=chat_template,
                              continue_final=continue_final,
                              enable_thinking=None if continue_final else enable_thinking)
        return _encode(tokenizer, text)
    if not continue_final:
        return render_ids(messages, tokenizer, add_generation_prompt=True, tools=tools)
    ids = render_ids(messages[:-1], tokenizer, add_generation_prompt=False, tools=tools)
    return ids + _plain_header(tokenizer, "assistant") + _encode(tokenizer, message_text(messages[-1]))


def continuation_ids(history: list[dict[str, Any]], new: list[dict[str, Any]], tokenizer,
                     tools: list[dict] | None = None) -> list[int] | None:
    """The ids to append after a conversation whose tokens are already held (``history``, ending with the
    assistant's last reply) for the ``new`` messages, ending with the generation prompt. None when a chat
    template renders ``history`` differently once it is extended (then the caller starts from scratch)."""
    if not _has_template(tokenizer):
        ids: list[int] = []
        for m in new:
            ids += _plain_header(tokenizer, m["role"]) + _plain_body(tokenizer, m)
        return ids + _plain_header(tokenizer, "assistant")
    before = _template_text(tokenizer, history, False, tools)
    after = _template_text(tokenizer, history + new, True, tools)
    if not after.startswith(before):
        return None
    return _encode(tokenizer, after[len(before):])


def split_conversation(messages: list[dict[str, Any]], tokenizer, tools: list[dict] | None = None,
                       prompt_messages: int | None = None) -> tuple[list[int], list[int], list[bool]]:
    """(prompt_ids, response_ids, action_mask) of a finished conversation (normalised messages) for training:
    the prompt is the first ``prompt_messages`` messages (default: everything before the first assistant
    turn), and ``action_mask`` is true on the tokens of the assistants that follow it only. ChatFormatError
    when no assistant speaks after the prompt."""
    prompt, response, mask, _ = split_conversation_turns(messages, tokenizer, tools, prompt_messages)
    return prompt, response, mask


def split_conversation_turns(messages: list[dict[str, Any]], tokenizer, tools: list[dict] | None = None,
                             prompt_messages: int | None = None
                             ) -> tuple[list[int], list[int], list[bool], list[int]]:
    """``split_conversation`` plus ``turn_ends``: for each assistant message of the response, in order, the
    index in ``response_ids`` of its last token (the end token that closes the turn), where a per-turn reward
    belongs. Taken from the rendering itself, since two assistant turns in a row leave no gap in the mask."""
    if prompt_messages is None:
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    else:
        first = prompt_messages
    if first is None or not any(m["role"] == "assistant" for m in messages[first:]):
        raise ChatFormatError("messages hold no assistant turn after the prompt: nothing for the policy to learn")
    ends: list[int] = []
    if not _has_template(tokenizer):
        prompt = _plain_tools(tokenizer, tools)
        response: list[int] = []
        mask: list[bool] = []
        for i, m in enumerate(messages):
            header, body = _plain_header(tokenizer, m["role"]), _plain_body(tokenizer, m)
            if i < first:
                prompt += header + body
            else:
                response += header + body
                mask += [False] * len(header) + [m["role"] == "assistant"] * len(body)
                if m["role"] == "assistant":
                    ends.append(len(response) - 1)
        return prompt, response, mask, ends
    prev = _template_text(tokenizer, messages[:first], False, tools) if first else ""
    prompt = _encode(tokenizer, prev)
    response, mask = [], []
    for i in range(first, len(messages)):
        text = _template_text(tokenizer, messages[:i + 1], False, tools)
        if not text.startswith(prev):
            raise ChatFormatError(f"the chat template renders messages[:{i}] differently once messages[{i}] "
                                  "follows; store this conversation as token ids instead")
        if messages[i]["role"] == "assistant":
            with_prompt = _template_text(tokenizer, messages[:i], True, tools)
            header = with_prompt[len(prev):] if with_prompt.startswith(prev) and text.startswith(with_prompt) else ""
            head_ids, body_ids = _encode(tokenizer, header), _encode(tokenizer, text[len(prev) + len(header):])
            if not body_ids:
                raise ChatFormatError(f"the chat template renders messages[{i}] (an assistant turn) as nothing")
            response += head_ids + body_ids
            mask += [False] * len(head_ids) + [True] * len(body_ids)
            ends.append(len(response) - 1)
        else:
            ids = _encode(tokenizer, text[len(prev):])
            response += ids
            mask += [False] * len(ids)
        prev = text
    return prompt, response, mask, ends
