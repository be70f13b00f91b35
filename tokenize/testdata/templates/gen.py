#!/usr/bin/env python3
"""Generate the chat-template goldens used by tokenize/chattemplate_test.go and the
interpreter conformance cases used by tokenize/jinja/conformance_test.go.

The reference is Python Jinja2 configured exactly as transformers configures it
(ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, loopcontrols]), tojson = json.dumps with ensure_ascii=False
and sort_keys=False, raise_exception, strftime_now with a fixed clock), driven by a
transcription of the request handling vLLM applies before rendering:

  * tools: ChatCompletionToolsParam(**tool).model_dump() with real pydantic models;
  * messages: vLLM's _parse_chat_message_content / _postprocess_messages for a text-only
    model, with its "auto" content-format detection (_detect_content_format);
  * developer messages -> system for templates that do not mention 'developer';
  * chat_template_kwargs merged into vLLM's kwargs dict and filtered as
    resolve_chat_template_kwargs does;
  * transformers' apply_chat_template / render_jinja_template (special tokens,
    continue_final_message trimming).

Run from anywhere:  python3 tokenize/testdata/templates/gen.py
(or with --random SEED COUNT OUT.json for a randomized matrix; see write_random).
Needs jinja2 >= 3.1 and pydantic >= 2. Reads the real templates from
../shared/tokenizers/{llama3,qwen2.5,qwen3,phi3} (relative to the repository root; they
are never copied) and writes golden.json next to this script and jinja_golden.json to
tokenize/jinja/testdata.
"""

import json
import os
import sys
from collections import deque
from datetime import datetime
from typing import Any, Literal, Optional

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, ConfigDict

HERE = os.path.dirname(os.path.abspath(__file__))
JINJA_TESTDATA = os.path.normpath(os.path.join(HERE, "..", "..", "jinja", "testdata"))
SHARED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", "shared", "tokenizers"))
FIXED_NOW = datetime(2024, 7, 23, 15, 4, 5)


# ---------------------------------------------------------------- Jinja environment


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag, rendering its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


# ---------------------------------------------------------------- vLLM request models


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


# ---------------------------------------------------------------- content format detection


def is_var_access(node, varname):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == varname


def is_attr_access(node, varname, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return is_var_access(node.node, varname) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return is_var_access(node.node, varname) and node.attr == key
    return False


def is_var_or_elems_access(node, varname, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return is_var_or_elems_access(node.node, varname, key)
    return is_attr_access(node, varname, key) if key else is_var_access(node, varname)


def assigned_from(root, varname):
    yield varname
    pending = deque([varname])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if is_var_or_elems_access(assign.node, current):
                assert isinstance(assign.target, jinja2.nodes.Name)
                yield assign.target.name
                if assign.target.name != current:
                    pending.append(assign.target.name)


def message_loop_vars(root):
    names = list(assigned_from(root, "messages"))
    for loop in root.find_all(jinja2.nodes.For):
        for name in names:
            if is_var_or_elems_access(loop.iter, name):
                assert isinstance(loop.target, jinja2.nodes.Name)
                yield loop.target.name
                break


def content_loops(root):
    message_vars = list(message_loop_vars(root))
    for loop in root.find_all(jinja2.nodes.For):
        for name in message_vars:
            if is_var_or_elems_access(loop.iter, name, "content"):
                assert isinstance(loop.target, jinja2.nodes.Name)
                yield loop
                break
        if isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name == "content":
            assert isinstance(loop.target, jinja2.nodes.Name)
            yield loop


def detect_content_format(chat_template):
    try:
        ast = ENV.parse(chat_template)
    except Exception:
        return "string"
    try:
        next(content_loops(ast))
    except StopIteration:
        return "string"
    except Exception:
        return "string"
    return "openai"


# ---------------------------------------------------------------- vLLM message preparation

TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def parse_part(part, wrap):
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    ptype = part.get("type")
    if ptype == "tool_reference":
        name = part.get("name")
        return {"type": "tool_reference", "name": name} if wrap else name
    if not isinstance(ptype, str) or ptype not in TEXT_KEYS:
        raise ValueError("unsupported content part in golden generator: %r" % (part,))
    content = part.get(TEXT_KEYS[ptype])
    if ptype in ("text", "refusal") and content is None:
        return None
    return {"type": "text", "text": content} if wrap else content


def parse_message(message, content_format):
    role = message["role"]
    content = message.get("content")
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    wrap = content_format == "openai"
    parts = [p for p in (parse_part(p, wrap) for p in content) if p]
    result = {"role": role, "content": parts if wrap else "\n".join(parts)}
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = []
            for tc in message["tool_calls"]:
                # pydantic TypedDict validation: declared keys only, in declaration order
                call = {}
                if "id" in tc:
                    call["id"] = tc["id"]
                fn = {}
                if "arguments" in tc["function"]:
                    fn["arguments"] = tc["function"]["arguments"]
                if "name" in tc["function"]:
                    fn["name"] = tc["function"]["name"]
                call["function"] = fn
                if "type" in tc:
                    call["type"] = tc["type"]
                calls.append(call)
            result["tool_calls"] = calls
        if reasoning is not None:
            result["reasoning"] = reasoning
            result["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        msg_content = result.get("content")
        if isinstance(msg_content, list):
            if not any(isinstance(i, dict) and i.get("type") != "text" for i in msg_content):
                texts = [i.get("text", "") for i in msg_content if isinstance(i, dict) and i.get("type") == "text"]
                result["content"] = "\n".join(texts) if texts else ""
    if "name" in message and isinstance(message["name"], str):
        result["name"] = message["name"]
    if "task" in message and isinstance(message["task"], str):
        result["task"] = message["task"]
    if role == "developer":
        result["tools"] = message.get("tools", None)
    return result


def postprocess(conversation):
    for message in conversation:
        if message["role"] == "assistant" and "tool_calls" in message:
            calls = message.get("tool_calls")
            if not isinstance(calls, list):
                continue
            if len(calls) == 0:
                message.pop("tool_calls", None)
                continue
            for item in calls:
                args = item["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        item["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    item["function"]["arguments"] = {}


def developer_to_system(conversation, chat_template):
    if not any(m["role"] == "developer" for m in conversation):
        return conversation
    if '"developer"' in chat_template or "'developer'" in chat_template:
        return conversation
    converted = []
    for m in conversation:
        if m["role"] == "developer":
            m = dict(m)
            m["role"] = "system"
            m.pop("tools", None)
        converted.append(m)
    contents, others, needs = [], [], False
    for i, m in enumerate(converted):
        if m["role"] == "system":
            if i > 0 or contents:
                needs = True
            c = m.get("content", "")
            if isinstance(c, list):
                c = "\n".join(p["text"] if isinstance(p, dict) else p for p in c if isinstance(p, str) or "text" in p)
            if c:
                contents.append(c)
        else:
            others.append(m)
    if not needs:
        return converted
    return [{"role": "system", "content": "\n\n".join(contents)}, *others]


HF_BASE_PARAMS = {
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
    "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
}


def apply_chat_template(conversation, chat_template, special, tools=None, documents=None,
                        add_generation_prompt=False, continue_final_message=False, **kwargs):
    """transformers' apply_chat_template(tokenize=False) + render_jinja_template."""
    for k in ("padding", "truncation", "max_length", "return_tensors", "return_dict",
              "return_assistant_tokens_mask", "tokenizer_kwargs"):
        kwargs.pop(k, None)
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when "
            "you want the model to continue the final message, and add_generation_prompt when you want to add a "
            "header that will prompt it to start a new assistant message instead."
        )
    conversation[0]  # IndexError on an empty conversation, as transformers' batch check
    template_kwargs = {**special, **kwargs}
    if tools is not None:
        for t in tools:
            if not isinstance(t, dict):
                raise ValueError("Tools should either be a JSON schema, or a callable function with type hints "
                                 "and a docstring suitable for auto-conversion to a schema.")
    if documents is not None:
        for d in documents:
            if not isinstance(d, dict):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    compiled = ENV.from_string(chat_template)
    rendered = compiled.render(messages=conversation, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **template_kwargs)
    if continue_final_message:
        final = conversation[-1]["content"]
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    break
            else:
                raise ValueError("continue_final_message is set but we could not find any text to continue"
                                 "in the final message!")
        if final.strip() not in rendered:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat after applying "
                "the chat template! This can happen if the chat template deletes portions of the final message. "
                "Please verify the chat template and final message in your chat to ensure they are compatible."
            )
        loc = rendered.rindex(final.strip())
        if rendered[loc: loc + len(final.lstrip())] == final:
            rendered = rendered[: loc + len(final.lstrip())]
        else:
            rendered = rendered[: loc + len(final.strip())]
    return rendered


def vllm_render(templates, special, req):
    """What vLLM's /v1/chat/completions renders for a request (text-only model)."""
    agp = req.get("add_generation_prompt", True)
    cfm = req.get("continue_final_message", False)
    if cfm and agp:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    messages = json.loads(req["messages"])
    tools = None
    if req.get("tools") is not None:
        tools = [ChatCompletionToolsParam.model_validate(t).model_dump() for t in json.loads(req["tools"])]
    documents = json.loads(req["documents"]) if req.get("documents") is not None else None
    kwargs = json.loads(req["kwargs"]) if req.get("kwargs") is not None else {}
    # transformers' get_chat_template: "tool_use" when tools are given, else "default"
    if tools is not None and "tool_use" in templates:
        chat_template = templates["tool_use"]
    else:
        chat_template = templates["default"]
    fmt = detect_content_format(chat_template)
    conversation = [parse_message(m, fmt) for m in messages]
    postprocess(conversation)
    conversation = developer_to_system(conversation, chat_template)
    kw = dict(add_generation_prompt=agp, continue_final_message=cfm, tools=tools, documents=documents)
    kw.update(kwargs)
    unexpected = {"chat_template", "tokenize"} & kw.keys()
    if unexpected:
        raise ValueError(f"Found unexpected chat template kwargs from request: {unexpected}")
    accept = jinja2.meta.find_undeclared_variables(ENV.parse(chat_template)) | HF_BASE_PARAMS
    kw = {k: v for k, v in kw.items() if k in accept}
    return apply_chat_template(conversation, chat_template, special, **kw)


# ---------------------------------------------------------------- templates

SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def load_model_dir(path):
    """Templates and special tokens the way transformers loads a tokenizer directory."""
    special, templates = {}, {}
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        for k in SPECIAL_KEYS:
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v.get("content")
            if v is not None:
                special[k] = v
        ct = cfg.get("chat_template")
        if isinstance(ct, str):
            templates["default"] = ct
        elif isinstance(ct, list):
            templates.update({t["name"]: t["template"] for t in ct})
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja):
        with open(jinja, encoding="utf-8") as f:
            templates["default"] = f.read()
    return templates, special


def build_templates():
    out = {}
    for model in ["llama3", "qwen2.5", "qwen3", "phi3"]:
        templates, special = load_model_dir(os.path.join(SHARED, model))
        out[model] = {"ref": {"model": model}, "templates": templates, "special": special}
    for model in ["multi", "jinja_override"]:
        templates, special = load_model_dir(os.path.join(HERE, "models", model))
        out["dir_" + model] = {"ref": {"dir": "models/" + model}, "templates": templates, "special": special}
    synthetic = {
        "mistral_like": {"bos_token": "<s>", "eos_token": "</s>"},
        "llama31_like": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "hermes_like": {"bos_token": "", "eos_token": "<|im_end|>"},
        "openai_content": {},
        "features": {"bos_token": "<|begin|>", "eos_token": "<|end|>"},
    }
    for name, special in synthetic.items():
        with open(os.path.join(HERE, name + ".jinja"), encoding="utf-8") as f:
            src = f.read()
        out[name] = {"ref": {"file": name + ".jinja", "special": special}, "templates": {"default": src}, "special": special}
    return out


# ---------------------------------------------------------------- conversations

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the weather — météo ☀️ for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. «Zürich»"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14, "description": "Forecast length"},
            "coords": {"type": "object", "description": "Optional position",
                       "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                       "required": ["lat", "lon"], "additionalProperties": {"type": "number"}},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Free tags"}},
            "required": ["city", "unit"]}}},
    {"function": {
        "name": "search_docs",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Full-text query \"quoted\" or not"},
            "limit": {"type": ["integer", "string"], "default": 10, "description": "Max hits, 1.5e3 at most"}},
            "required": ["query"]},
        "strict": True}, "type": "function"},
]

CALL_ARGS = json.dumps({"city": "Zürich", "unit": "celsius", "coords": {"lat": 47.37, "lon": 8.54}, "days": 3,
                        "tags": ["été", "🌞"]}, ensure_ascii=False)

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "  Be concise.\n"},
        {"role": "user", "content": "Hi there 👋  "},
        {"role": "assistant", "content": "Hello! How can I help?\n"},
        {"role": "user", "content": "Tell me about Zürich, naïve café — “quotes” & <tags>.\n\nTwo lines."},
        {"role": "assistant", "content": "Zürich is a city in Switzerland."},
        {"role": "user", "content": "Thanks!\tAnd then?"},
    ],
    "tools": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Zürich for 3 days?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": CALL_ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5, \"sky\": \"☀️\"}"},
        {"role": "assistant", "content": "It is sunny, 21.5 °C."},
        {"role": "user", "content": "And search the docs for 'föhn'."},
    ],
    "parallel_tools": [
        {"role": "user", "content": "Weather in Bern and Basel?"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [
            {"type": "function", "function": {"arguments": "{\"city\": \"Bern\", \"unit\": \"celsius\"}", "name": "get_weather"}, "id": "a", "extra": 1},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Basel", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "18"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "19"}, {"type": "text", "text": "cloudy"}]},
        {"role": "user", "content": "Thanks"},
    ],
    "bad_arguments": [
        {"role": "user", "content": "Call it."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "search_docs", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "x", "content": "error"},
    ],
    "multipart": [
        {"role": "system", "content": [{"type": "text", "text": "Rules:"}, {"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Part one."}, {"type": "text", "text": ""}, "plain string part",
            {"type": "input_text", "text": "Part three."}, {"type": "text", "text": None}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "Last question?"}]},
    ],
    "wrong_order": [
        {"role": "user", "content": "First"},
        {"role": "user", "content": "Second"},
    ],
    "prefill": [
        {"role": "user", "content": "Complete: the answer is"},
        {"role": "assistant", "content": "The answer is  "},
    ],
    "reasoning": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is 6.", "reasoning_content": "Add three twice."},
        {"role": "user", "content": "Thanks"},
    ],
    "developer": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": "Hello", "name": "alice"},
    ],
    "named": [
        {"role": "user", "content": "Hi", "name": "bob", "extra_field": 42},
        {"role": "assistant", "content": "Hello Bob", "name": "helper", "reasoning": "greeting"},
        {"role": "user", "content": "Bye", "task": "chat"},
    ],
}

DOCUMENTS = [{"title": "Alps", "text": "The Alps are high mountains."}, {"text": "Untitled note about föhn winds."}]


def case_matrix(templates):
    cases = []

    def add(tpl, conv, **flags):
        cases.append(dict(template=tpl, request=conv, **flags))

    for tpl in ["llama3", "qwen2.5", "qwen3", "phi3", "mistral_like", "llama31_like", "hermes_like",
                "openai_content", "features"]:
        for conv in CONVERSATIONS:
            add(tpl, conv, add_generation_prompt=True, tools=conv == "tools")
        for conv in ["single_user", "multi_turn"]:
            add(tpl, conv, add_generation_prompt=False)
        add(tpl, "prefill", add_generation_prompt=False, continue_final_message=True)
        add(tpl, "multi_turn", add_generation_prompt=False, continue_final_message=True)
        if tpl in ("qwen2.5", "qwen3", "llama31_like", "hermes_like"):
            add(tpl, "single_user", add_generation_prompt=True, tools=True)
            add(tpl, "parallel_tools", add_generation_prompt=False, tools=True)
    for conv in ["single_user", "reasoning", "tools", "multi_turn"]:
        add("qwen3", conv, add_generation_prompt=True, tools=conv == "tools", kwargs={"enable_thinking": False})
    add("qwen3", "reasoning", add_generation_prompt=True, kwargs={"enable_thinking": True})
    add("llama3", "system_user", add_generation_prompt=True, kwargs={"bos_token": "<BOS-OVERRIDE>"})
    add("llama3", "single_user", add_generation_prompt=True, kwargs={"add_generation_prompt": False, "unused": [1]})
    add("qwen2.5", "single_user", add_generation_prompt=True, kwargs={"chat_template": "x"})
    add("qwen2.5", "single_user", add_generation_prompt=True, continue_final_message=True)
    add("phi3", "prefill", add_generation_prompt=False, continue_final_message=True,
        kwargs={"add_generation_prompt": True})
    add("features", "multi_turn", add_generation_prompt=True, documents=True,
        kwargs={"enable_thinking": False, "custom": {"a": [1, 2.5, None]}})
    add("features", "bad_arguments", add_generation_prompt=True, documents=True)
    add("llama31_like", "tools", add_generation_prompt=True, tools=True, kwargs={"tools_in_user_message": False})
    add("llama31_like", "single_user", add_generation_prompt=True,
        kwargs={"builtin_tools": ["code_interpreter", "brave_search", "wolfram_alpha"], "date_string": "01 Jan 2025"})
    add("openai_content", "single_user", add_generation_prompt=True, tools=True, kwargs={"tools": None})
    for conv in ["single_user", "tools", "parallel_tools"]:
        add("dir_multi", conv, add_generation_prompt=True, tools=conv != "single_user")
    add("dir_multi", "single_user", add_generation_prompt=False, tools=True)
    add("dir_jinja_override", "multi_turn", add_generation_prompt=True)
    return cases


def main():
    templates = build_templates()
    requests = {}
    for name, msgs in CONVERSATIONS.items():
        requests[name] = json.dumps(msgs, ensure_ascii=False)
    tools_json = json.dumps(TOOLS, ensure_ascii=False)
    docs_json = json.dumps(DOCUMENTS, ensure_ascii=False)
    out_cases = []
    for c in case_matrix(templates):
        t = templates[c["template"]]
        req = {
            "messages": requests[c["request"]],
            "add_generation_prompt": c.get("add_generation_prompt", True),
            "continue_final_message": c.get("continue_final_message", False),
        }
        if c.get("tools"):
            req["tools"] = tools_json
        if c.get("documents"):
            req["documents"] = docs_json
        if "kwargs" in c:
            req["kwargs"] = json.dumps(c["kwargs"], ensure_ascii=False)
        entry = {
            "template": c["template"],
            "messages": c["request"],
            "add_generation_prompt": req["add_generation_prompt"],
            "continue_final_message": req["continue_final_message"],
            "tools": bool(c.get("tools")),
            "documents": bool(c.get("documents")),
        }
        if "kwargs" in req:
            entry["kwargs"] = req["kwargs"]
        try:
            entry["output"] = vllm_render(t["templates"], t["special"], req)
        except Exception as e:  # the golden records the error vLLM would answer with
            entry["error"] = str(e)
            entry["error_type"] = type(e).__name__
        out_cases.append(entry)
    golden = {
        "comment": "Generated by gen.py; do not edit. Reference: jinja2 %s as transformers configures it, "
                   "vLLM request handling transcribed in gen.py, strftime_now fixed at %s."
                   % (jinja2.__version__, FIXED_NOW.isoformat()),
        "fixed_now": FIXED_NOW.isoformat(),
        "templates": {name: t["ref"] for name, t in templates.items()},
        "messages": requests,
        "tools": tools_json,
        "documents": docs_json,
        "cases": out_cases,
    }
    with open(os.path.join(HERE, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in out_cases if "error" in c)
    print("golden.json: %d cases (%d errors)" % (len(out_cases), n_err))
    write_jinja_golden()


# ---------------------------------------------------------------- interpreter conformance cases

JINJA_CONTEXT = {
    "x": "hello", "d": {"b": 2, "a": 1, "c": [1, "é"]}, "lst": [1, 2, 3], "big": 12345678901234567890,
    "f": 1.5, "z": 0, "t": True, "nul": None, "empty": "",
    "msgs": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}],
}

JINJA_CASES = [
    # printing and literals
    "{{ none }}|{{ x }}|{{ true }}|{{ false }}|{{ nul }}|{{ big }}|{{ -big }}",
    "{{ 1.0 }}|{{ 10/4 }}|{{ 10//4 }}|{{ 7 % 3 }}|{{ 2**10 }}|{{ 1e20 }}|{{ 0.1+0.2 }}|{{ 1_000 }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}",
    "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123456789.123 }} {{ -0.0 }} {{ 1.5e300*1e10 }} {{ 1e-7 }} {{ 123e20 }} {{ 12345678901234567.0 }} {{ 2/3*3 }} {{ 1/3 }}",
    "{{ 'x' ~ [1, 'a'] ~ {'k': 'v'} ~ (1,) ~ none ~ true ~ 1.5 }}|{{ (1,) }} {{ () }} {{ [(1,2)] }} {{ 1, 2 }}",
    "{{ 'it\\'s' ~ [\"it's\", 'a\"b', 'a\\nb', '\\x01', 'é\\u2028', '\\t\\\\', 'both\\'\"'] }}",
    "{{ '\\u00e9\\x41\\101\\N' }}|{{ 'tab\\there' }}|{{ \"line1\\nline2\" }}",
    # subscripts and slices
    "{{ [1,2,3][::-1] }}|{{ 'abc'[::-1] }}|{{ 'abcdef'[1:3] }}|{{ [1,2,3][-1] }}|{{ 'héllo'[1] }}|{{ 'héllo'[-2:] }}|{{ lst[5:] }}|{{ lst[-10:1] }}|{{ lst[::2] }}|{{ x[10] }}|",
    "{{ d['a'] }}|{{ d.a }}|{{ msgs[0]['role'] }}|{{ msgs[0].content }}|{{ d.missing }}|{{ d['items'] is defined }}|{{ lst.0 }}",
    # namespaces and loops
    "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns.a }}|{{ ns }}",
    "{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys()|list }}|{{ d }}|{{ d.values()|list }}",
    "{% for x in lst %}{{ loop.index }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.depth }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for x in [1,2,3] %}{{ loop.cycle('o','e') }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.changed(x>1) }} {% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% endfor %}",
    "{% for a, b in [[1,2],[3,4]] %}{{ a }}{{ b }}{% endfor %}|{% for m in msgs if m.role == 'user' %}{{ loop.index }}{{ m.content }}{% endfor %}",
    "{% for x in 'ab' %}{{ x }}{% endfor %}{% for k in {'a':1,'b':2} %}{{ k }}{% endfor %}",
    "{% for item in [[1, [2, [3]]]] recursive %}<{{ item if item is number else loop(item) }}:{{ loop.depth }}>{% endfor %}",
    # scoping
    "{% set count = 0 %}{% for i in [1,2] %}{% set count = count + 1 %}{{ count }}{% endfor %}|{{ count }}",
    "{% for i in [1,2] %}{% if i == 2 %}{{ v }}{% endif %}{% set v = i %}{% endfor %}|{{ v }}",
    "{% if true %}{% set a = 5 %}{% endif %}{{ a }}|{% set x2 = 1 %}{% for i in [1] %}{{ x2 }}{% set x2 = 2 %}{{ x2 }}{% endfor %}{{ x2 }}",
    "{% macro m() %}{{ g }}{% endmacro %}{% set g = 1 %}{{ m() }}{% set g = 2 %}{{ m() }}",
    "{% with a = 1 %}{{ a }}{% endwith %}{{ a }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}",
    # macros
    "{% macro m(a, b=a~'x') %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 2, 3, z=4) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m() }}|{{ m(b=1) }}",
    "{% macro m() %}[{{ caller(5) }}]{% endmacro %}{% call(x) m() %}c{{ x }}{% endcall %}|{% macro n(v) %}{{ v }}{% endmacro %}{{ n(v='kw') }}",
    "{% macro fact(n) %}{{ 1 if n <= 1 else n * fact(n - 1) | int }}{% endmacro %}{{ fact(10) }}",
    "{% set x %}  a {{ 1 }} {% endset %}[{{ x }}]|{% set y | upper %}ab{% endset %}{{ y }}|{% filter upper | replace('A','z') %}ab{% endfilter %}",
    # tests and operators
    "{{ x is string }}|{{ undefinedvar is defined }}|{{ d is mapping }}|{{ lst is iterable }}|{{ none is none }}|{{ x is none }}|{{ nul is defined }}",
    "{{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 1.0 is float }} {{ 'a' is sequence }} {{ {} is sequence }} {{ undef is iterable }} {{ undef is callable }} {{ 1 is false }} {{ false is false }} {{ 0 is true }}",
    "{{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ 'ab' is lower }} {{ 2 is in [1,2] }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'a' is ne 'b' }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }}",
    "{{ 'abc' in 'xxabcxx' }}|{{ 2 in lst }}|{{ 'a' in d }}|{{ 'zz' not in d }}|{{ none in [none] }}|{{ 1 == 1.0 }}|{{ '1' == 1 }}|{{ [1,2] == [1,2] }}|{{ (1,2) == [1,2] }}",
    "{{ lst[0] + lst[1] }}|{{ lst + [9] }}|{{ 'ab' * 3 }}|{{ -lst[0] }}|{{ 3 * 'ab' }}|{{ [1] * 2 }}|{{ 'abc' * -1 }}|",
    "{{ 7 // -2 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 2 ** -1 }} {{ -7.5 % 2 }} {{ 7 % -2.5 }} {{ big * big }} {{ big // 7 }} {{ big % 7 }} {{ 2 ** 70 }}",
    "{{ true + 1 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 == 2 }} {{ - 2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ not 1 == 2 }}",
    "{{ 'a' if x else 'b' }}|{{ 'yes' if none else 'no' }}|{{ 1 if [] else 2 }}|{{ 'a' if false }}|{{ 1 if 0 else 2 if 1 else 3 }}",
    "{{ foo is defined and foo }}|{{ foo or 'alt' }}|{{ '' or none }}|{{ 0 and 1 }}|{{ x and lst }}",
    "{{ '%s and %s' % ('a', 'b') }} {{ '%d' % 3 }} {{ '%5.1f|%-4d|%s|%r|%x|%%' % (3.14159, 42, none, 'q', 255) }} {{ '%(k)s' % {'k': 'v'} }} {{ '%+d %05d %e %g %G' % (5, -42, 12345.678, 0.00001234, 1e20) }}",
    # string methods
    "{{ 'a,b'.split(',') }}|{{ '  x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'Hello World'.lower() }}|{{ 'hello world'.title() }}|{{ \"they're bill's\".title() }}",
    "{{ x.startswith('he') }}|{{ x.endswith('lo') }}|{{ x.upper() }}|{{ x.replace('l', 'L') }}|{{ x.split('l') }}|{{ x.rstrip('o') }}|{{ x.replace('l', 'L', 1) }}|{{ x.replace('', '-') }}",
    "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',', 1) }} {{ 'abc'.rsplit('b') }} {{ ' a  b  c '.split(None, 1) }} {{ ' a  b  c '.rsplit(None, 1) }} {{ 'a,b,c'.rsplit(',', 1) }}",
    "{{ '{} {}'.format(1, 'x') }} {{ '{a}'.format(a=2) }} {{ '{0}-{1}-{0}'.format('a', 'b') }} {{ '{:>5}'.format('x') }} {{ '{:.2f}'.format(3.14159) }} {{ '{!r}'.format('x') }} {{ '{:^7}|{:<3}|{:03d}|{:,}'.format('ab', 'c', 7, 1234567) }}",
    "{{ 'x'.strip('') }} {{ 'aXbXc'.split('X', 1) }} {{ ' a '.lstrip() }} {{ 'abc'.find('c') }} {{ 'a-b'.partition('-') }} {{ 'a-b-c'.rpartition('-') }}",
    "{{ 'abc'.startswith(('x', 'a')) }} {{ 'Hello'.upper() }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '  '.isspace() }} {{ 'x'.zfill(3) }} {{ '-5'.zfill(4) }}",
    "{{ 'ß'.upper() }} {{ 'İ'.lower()|length }} {{ 'ÉCOLE'.lower() }} {{ 'straße'.capitalize() }} {{ 'ab12'.isalnum() }} {{ '12'.isdigit() }} {{ 'Ab'.istitle() }}",
    "{{ [1,2,1].count(1) }} {{ [1,2].index(2) }} {{ 'abcabc'.count('b') }} {{ 'abc'.index('c') }} {{ 'héllo'.find('l') }} {{ 'abc'.center(7, '*') }} {{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}",
    "{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 7) }} {{ {'a': 1}.keys()|list }} {{ {'a': 1}.items()|list }} {{ {'a':1}.values()|list }} {{ d.copy() }}",
    # filters
    "{{ lst|length }}|{{ lst|first }}|{{ lst|last }}|{{ '  pad  '|trim }}|{{ lst|map('string')|join }}|{{ lst|reverse|list }}|{{ 'xxpadxx'|trim('x') }}",
    "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}|{{ msgs|rejectattr('role','equalto','user')|list|length }}",
    "{{ d|tojson }}|{{ lst|tojson }}|{{ 'é\"<>&\\'\\n'|tojson }}|{{ big|tojson }}|{{ f|tojson }}|{{ nul|tojson }}|{{ (1,'a')|tojson }}",
    "{{ {'a': {'b': [1, {}, []]}, 'c': 'x'} | tojson(indent=2) }}|{{ {'a': 1} | tojson(indent='\\t') }}|{{ [] | tojson(indent=2) }}|{{ [[]] | tojson(indent=0) }}",
    "{{ {1: 2, 1.5: 3, true: 4, none: 5} | tojson }}|{{ [1,2] | tojson(separators=(',', ':')) }}|{{ {'b':1,'a':2} | tojson(sort_keys=true) }}|{{ 'a\\u2028b\\x7f\\x01\"' | tojson }}|{{ 'é😀' | tojson(ensure_ascii=true) }}",
    "{{ [1,2,3] | map('string') | list }}|{{ [{'a':1},{'a':2}] | map(attribute='a') | list }}|{{ [{'a':1},{}] | map(attribute='a', default=9) | list }}|{{ msgs | map(attribute='role') | unique | list }}",
    "{{ [1,2,3]|first }} {{ []|first }} {{ 'abc'|last }} {{ {'x':1,'y':2}|first }} {{ undef|first }}",
    "{{ 'hello world-foo (bar' | title }} {{ 'hELLO' | capitalize }} {{ 'HeLLo'|lower }} {{ 'straße'|upper }}",
    "{{ '  a\\n  b' | indent(2) }}|{{ 'a\\n\\nb' | indent(2, true, true) }}|{{ 'a\\nb' | indent('>>', first=true) }}|{{ 'a\\n\\nb' | indent }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 5|round }} {{ 2.5|round(method='ceil') }} {{ 2.4|round(0, 'floor') }} {{ -2.5|round }} {{ 1234.5678|round(-2) }}",
    "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 3.9|int }} {{ none|int }} {{ ' 7 '|int }} {{ '0x1A'|int(base=16) }} {{ true|int }} {{ 'x'|int(5) }} {{ '-3'|int }}",
    "{{ '1.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ ' 2.5e3 '|float }} {{ 'inf'|float }}",
    "{{ [3,1,2]|sort }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} {{ [3,1]|sort(reverse=true) }} {{ msgs|sort(attribute='content')|map(attribute='content')|join }}",
    "{{ [1,2,2,'a','A']|unique|list }} {{ ['b','a']|max }} {{ [1,5,2]|min }} {{ []|max }} {{ ['B','a','C']|max }} {{ ['B','a','C']|max(case_sensitive=true) }}",
    "{{ {'b':1,'A':2}|dictsort }} {{ {'b':1,'a':2}|dictsort(by='value') }} {{ {'b':1,'a':2}|dictsort(reverse=true) }}",
    "{{ [1,2,3]|select('odd')|list }} {{ [1,2,3]|reject('odd')|list }} {{ [0,1,'',2]|select|list }} {{ [1,5,10]|select('gt', 4)|list }} {{ [1,5,10]|select('>', 4)|list }}",
    "{{ [{'r':'u'},{'r':'a'}]|selectattr('r','equalto','u')|list }} {{ [{'r':'u'},{}]|selectattr('r')|list }} {{ msgs|selectattr('role', 'in', ['assistant'])|list|length }}",
    "{{ [1,2]|join }} {{ [1,2]|join('-') }} {{ [{'n':'a'},{'n':'b'}]|join(',', attribute='n') }} {{ undef|join(',') }}|",
    "{{ [1,2,3]|sum }} {{ [{'v':1},{'v':2}]|sum(attribute='v') }} {{ [1]|sum(start=10) }} {{ [0.5, 1]|sum }}",
    "{{ 'a%sb'|format(1) }} {{ '%(x)s'|format(x=2) }} {{ x|default('d') }} {{ undef|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }}",
    "{{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3]|batch(2, 0)|list }} {{ [1,2,3,4,5]|slice(2)|list }} {{ [1,2,3,4]|slice(3, 'x')|list }}",
    "{{ 'a b c'|wordcount }} {{ 'abc'|center(7) }}| {{ 'hello'|truncate(3) }} {{ 'hello world foo'|truncate(9) }} {{ 'hello world foo'|truncate(9, true) }} {{ 'hello world foo bar baz'|truncate(12, false, '…', 0) }}",
    "{{ {'a':1}|items|list }} {{ undef|items|list }} {{ 'abc'|length }} {{ {'a':1}|count }} {{ undef|length }} {{ '<a href=\"x\">'|e }} {{ '<a>'|escape ~ 'x' }} {{ '<a>'|safe }}",
    "{{ [{'g': 'b', 'v': 1}, {'g': 'a', 'v': 2}, {'g': 'b', 'v': 3}]|groupby('g')|map('first')|list }} {{ (msgs|groupby('role'))[1][1]|length }}",
    "{{ -1|abs }} {{ -1.5|abs }} {{ x|attr('upper') is defined }} {{ d|attr('a') }} {{ lst|pprint }} {{ 'x'|string ~ 1|string }} {{ [1, 'x']|string }}",
    # globals
    "{% set c = cycler('a','b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}|{% set j = joiner('|') %}{{ j() }}a{{ j() }}b{{ j() }}c",
    "{{ dict(a=1, b=2) }} {{ dict({'z':1}, y=2) }} {{ namespace({'a':1}, b=2).b }} {{ range(2, 10, 3)|list }} {{ range(5)|sum }} {{ range(10, 0, -3)|list }}",
    "{{ range(100001) }}",
    "{{ raise_exception('custom failure: ' ~ x) }}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %A %b %B %d %j %p %I %y') }}",
    # errors
    "{{ [1,2].append(3) }}", "{{ {'a':1}.pop('a') }}", "{{ foo.bar }}", "{{ foo + 1 }}", "{{ {'a':1}.b.c }}",
    "{{ [1][3].x }}", "{{ 1 + 'a' }}", "{{ 'a' + 1 }}", "{{ [1] < 'a' }}", "{{ undefined_x | tojson }}",
    "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 1.5 % 0 }}", "{{ none < 1 }}", "{{ x < 1 }}", "{{ 'a' ~ 1 + 2 }}",
    "{{ {'a': 1}|items|list }}{{ 5|items|list }}", "{{ none.x }}|{{ 'abc'.nope }}|{{ [1][3] }}|{{ 'x'.__class__ }}",
    "{% set ns = 5 %}{% set ns.a = 1 %}", "{% for a, b in [1] %}{% endfor %}", "{{ 1 in 5 }}", "{{ 1 in 'abc' }}",
    "{{ msgs[0].content.foo.bar }}", "{{ [] | first | upper }}",
    "{% if [1].append %}yes{% else %}no{% endif %}|{{ 'a' in undef }}|{% for x in [1].append %}{{ x }}{% endfor %}|{{ [1].append is defined }}",
    "{{ undef in 'abc' }}", "{{ [1].append() }}", "{{ [1].sort }}|{{ {}.update }}",
    "{% if false %}{{ x | nosuchfilter }}{% endif %}ok", "{% if true %}{{ x | nosuchfilter }}{% endif %}",
    "{{ x if x is nosuchtest else 'y' }}", "{{ x if true else (x | nosuchfilter) }}",
    "{{ x | nosuchfilter }}", "{% if x %}", "{% for %}", "{% endif %}", "{% do x %}", "{{ x + }}", "{{ 'unterminated }}",
    "{% set 1 = 2 %}", "{{ x.1 }}", "{% macro m(a=1, b) %}{% endmacro %}", "{{ (1, 2 }}", "{% break %}",
    "{% include 'x.html' %}", "{% if false %}{% include 'x.html' %}{% endif %}ok",
    "{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}",
    "{% set a = 5 %}{% with a=1, b=a %}{{ a }}{{ b }}{% endwith %}|{% for x in [1,2,3] if loop is defined %}{{ x }}{% endfor %}",
    "{% for x in [[1,[2]],3] recursive %}{% if x is iterable %}[{{ loop(x) }}]{% else %}{{ x }}@{{ loop.depth }}{% endif %}{% else %}E{% endfor %}",
    "{% macro m(caller) %}{{ caller() }}{% endmacro %}{% call m() %}y{% endcall %}",
    "{% set x = [1,2] %}{% for i in x %}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}|{% macro m() %}{% set q = 1 %}{{ q }}{% endmacro %}{{ m() }}{{ q }}",
    "{% for x in [1] %}{% macro inner() %}{{ x }}{% endmacro %}{{ inner() }}{% endfor %}|{% if true %}{% set y = 1 %}{% endif %}{% for i in [1] %}{{ y }}{% endfor %}",
    "{% set ns = namespace(a=[]) %}{% for i in range(3) %}{% set ns.a = ns.a + [loop.index] %}{% endfor %}{{ ns.a }}",
    "{{ '%s %s' % [1, 2] }}", "{{ '%s' % none }}|{{ '%s|%s' % (none, undef) }}",
    # lazy objects: generators (map/select/...), reverse iterators, dict views
    "{% set g = msgs|selectattr('role', 'equalto', 'system') %}{{ 'yes' if g else 'no' }}|{{ g|list }}|{{ (lst|map('string'))[0] }}|{{ lst|map('string') is sequence }}|{{ d.keys() is sequence }}",
    "{% set g = lst|map('string') %}{{ g|join }}|{{ g|join }}|{% set r = lst|reverse %}{{ r|list }}{{ r|list }}|{% set h = lst|select %}{% for x in h %}{{ x }}{% endfor %}{% for x in h %}{{ x }}{% endfor %}",
    "{% set g = lst|map('int') %}{{ 2 in g }}|{{ g|list }}|{{ lst|map('string')|first }}|{{ lst|reverse|first }}|{{ (lst|map('string')|list)[1] }}",
    "{{ msgs|selectattr('role')|length }}", "{{ lst|map('string')|last }}", "{{ lst|select|tojson }}", "{{ {}.keys()|tojson }}",
    "{{ {'a': 1}.items() }} {{ {'a': 1}.keys() }} {{ {'a': [1]}.values() }} {{ {'a':1}.keys()|length }} {{ {'a':1}.keys()[0] }}|{{ 'a' in {'a':1}.keys() }} {{ ('a', 1) in {'a':1}.items() }} {% if {}.items() %}y{% else %}n{% endif %}",
    "{% for k, v in d.items() | sort %}{{ k }}{{ v }}{% endfor %}|{{ d.values() | sum(start=[]) if false else d.keys() | join(',') }}|{{ d|reverse|list }}|{{ 'abc'|reverse }}|{{ lst|batch(2)|list|length }}",
    # whitespace control
    "{%- if true %}\n  A\n{%- endif %}\n  {% if true %}\nB\n  {% endif %}\nC {# comment #}\n   {# c2 #}\nD",
    "abc  {% if true %}X{% endif %}|\n  {%+ if true %}Y{% endif %}|{{ 'a' }}   {#- c #}  z|a\t{%- if true -%}\t b\t{%- endif %}",
    "x\n    {% for i in [1,2] %}\n    {{ i }}\n    {% endfor %}\ny",
    "{% raw %}{{ not rendered }}{% endraw %}|  {% raw -%}  keep {%- endraw %}|\n  {% generation %}gen{{ 1 }}{% endgeneration %}",
    "a {%- if true +%}  \n b {%+ endif -%}  c\n{#- trimmed #}\nd{{- ' e ' -}}\n f",
    "{{ \"{{ not a tag }}\" }}|{{ {'a': {'b': 1}} }}|{{ (1, 2)[1] }}",
    "{% if x %}\n    line\n{% endif %}\n",
    "{% for m in msgs %}\n  {{ m.role }}:\n    {%- if m.role == 'user' %} U{% else %} A{% endif %}\n{% endfor %}\n",
]


def write_jinja_golden():
    cases = []
    for t in JINJA_CASES:
        entry = {"t": t}
        try:
            entry["out"] = ENV.from_string(t).render(**JINJA_CONTEXT)
        except Exception as e:
            entry["error"] = str(e)
            entry["error_type"] = type(e).__name__
        cases.append(entry)
    with open(os.path.join(JINJA_TESTDATA, "jinja_golden.json"), "w", encoding="utf-8") as f:
        json.dump({"comment": "Generated by gen.py; do not edit.", "context": JINJA_CONTEXT, "cases": cases},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("jinja_golden.json: %d cases" % len(cases))


# ---------------------------------------------------------------- randomized differential matrix

def write_random(seed, count, path):
    """A randomized matrix in golden.json's format, for a wider differential test:
    python3 gen.py --random SEED COUNT /tmp/rand.json
    KVGATE_TEMPLATE_GOLDEN=/tmp/rand.json go test -run TestChatTemplateGolden ./tokenize/
    """
    import random
    rnd = random.Random(seed)
    templates = build_templates()
    words = ["hello", "Zürich", "naïve", "  spaced  ", "\n", "<think>", "</think>", "tab\t", "😀", "\"q\"", "'s",
             "{{ x }}", "{%", "a\\b", "", " ", "<tool_response>", "</tool_response>", "ünï", "\u2028", "end"]

    def text():
        return "".join(rnd.choice(words) for _ in range(rnd.randint(0, 6)))

    def content():
        r = rnd.random()
        if r < 0.6:
            return text()
        if r < 0.7:
            return None
        parts = []
        for _ in range(rnd.randint(0, 3)):
            q = rnd.random()
            if q < 0.6:
                parts.append({"type": "text", "text": text()})
            elif q < 0.75:
                parts.append(text())
            elif q < 0.8:
                parts.append({"type": "input_text", "text": text()})
            elif q < 0.85:
                parts.append(rnd.choice([{"type": "input_text"}, {"type": "thinking", "thinking": None},
                                         {"type": "refusal", "refusal": text()}, {"type": "output_text", "text": None}]))
            else:
                parts.append({"type": "text", "text": None})
        return parts

    def arguments():
        r = rnd.random()
        if r < 0.5:
            return json.dumps({"city": text(), "n": rnd.randint(-5, 5), "f": rnd.choice([1.5, 2.0, 1e20]),
                               "l": [text(), None, True]}, ensure_ascii=rnd.random() < 0.5)
        if r < 0.7:
            return {"k": text()}
        if r < 0.8:
            return "not json"
        if r < 0.9:
            return ""
        return None

    def message():
        role = rnd.choice(["user", "assistant", "system", "tool", "user", "assistant", "developer"])
        m = {"role": role, "content": content()}
        if role == "assistant" and rnd.random() < 0.4:
            calls = []
            for j in range(rnd.randint(0, 2)):
                c = {"id": "c%d" % j, "type": "function",
                     "function": {"name": rnd.choice(["get_weather", "search_docs"]), "arguments": arguments()}}
                if c["function"]["arguments"] is None:
                    del c["function"]["arguments"]
                calls.append(c)
            m["tool_calls"] = calls
        if role == "assistant" and rnd.random() < 0.3:
            m[rnd.choice(["reasoning", "reasoning_content"])] = text()
        if role == "tool" and rnd.random() < 0.7:
            m["tool_call_id"] = "c0"
        if rnd.random() < 0.1:
            m["name"] = text()
        return m

    names = [n for n in templates if not n.startswith("dir_")] + ["dir_multi"]
    tools_json = json.dumps(TOOLS, ensure_ascii=False)
    docs_json = json.dumps(DOCUMENTS, ensure_ascii=False)
    requests, cases = {}, []
    for i in range(count):
        key = "r%d" % i
        requests[key] = json.dumps([message() for _ in range(rnd.randint(1, 6))], ensure_ascii=rnd.random() < 0.3)
        agp = rnd.random() < 0.7
        c = {"template": rnd.choice(names), "messages": key, "add_generation_prompt": agp,
             "continue_final_message": (not agp) and rnd.random() < 0.3,
             "tools": rnd.random() < 0.3, "documents": rnd.random() < 0.1}
        if rnd.random() < 0.2:
            c["kwargs"] = json.dumps(rnd.choice([{"enable_thinking": False}, {"enable_thinking": True},
                                                 {"bos_token": "B"}, {"add_generation_prompt": not agp}]))
        req = {"messages": requests[key], "add_generation_prompt": agp,
               "continue_final_message": c["continue_final_message"]}
        if c["tools"]:
            req["tools"] = tools_json
        if c["documents"]:
            req["documents"] = docs_json
        if "kwargs" in c:
            req["kwargs"] = c["kwargs"]
        t = templates[c["template"]]
        try:
            c["output"] = vllm_render(t["templates"], t["special"], req)
        except Exception as e:
            c["error"] = str(e)
            c["error_type"] = type(e).__name__
        cases.append(c)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"templates": {n: t["ref"] for n, t in templates.items()}, "messages": requests,
                   "tools": tools_json, "documents": docs_json, "cases": cases}, f, ensure_ascii=False)
    print("%s: %d random cases" % (path, len(cases)))


if __name__ == "__main__":
    if not os.path.isdir(SHARED):
        sys.exit("missing %s: the real tokenizer files are needed" % SHARED)
    if len(sys.argv) == 5 and sys.argv[1] == "--random":
        write_random(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main()
