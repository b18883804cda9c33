#!/usr/bin/python3
"""Builds tests/data/chat/corpus.jsonl: chat requests and the exact prompt Python Jinja2 renders.

Run it by hand (never from a test) with Debian's python3-jinja2 (3.1.2):

    /usr/bin/python3 tools/gen_chat_corpus.py

The conversations come from a seeded random generator, so the output is reproducible. Each
request goes through the same pre-processing vLLM applies before rendering (chat_utils.py:
parse_chat_messages + _postprocess_messages), restated here and in src/chat/chat.c:

  * content: a string becomes one text part, null becomes no parts; text parts ("text",
    "input_text", "output_text", "refusal", "thinking") are kept. A template that loops over
    message content ("openai" format, detected as vLLM does) gets [{"type": "text", "text": t}];
    any other template gets the non-empty texts joined with "\n".
  * assistant: tool_calls (when not null) are kept, an empty list is dropped, and each
    function.arguments given as a string is parsed as JSON (invalid or empty -> {}; a non-string,
    non-object, non-array value -> {}). reasoning (or, when absent, reasoning_content) is passed
    under both names. tool: tool_call_id is kept and content is always the joined text.
    name (a string) is kept; developer messages keep their tools.
  * template variables: the tokenizer's special tokens, then --default-chat-template-kwargs, then
    the request's chat_template_kwargs, then messages/tools/documents/add_generation_prompt
    (tools and documents are None when absent).
  * continue_final_message: transformers' (>= 4.57) marker "CONTINUE_FINAL_MESSAGE_TAG " is
    appended to the final message's text, and the rendering is cut at the marker.

The environment is transformers': ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[loopcontrols, generation tag]), tojson = json.dumps(x,
ensure_ascii=False, ...), raise_exception and strftime_now globals.
"""
import copy
import json
import os
import random
import sys
from datetime import datetime, timezone

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat")

QWEN_SPECIALS = {
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
                                  "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                  "<|video_pad|>"],
}
TEMPLATES = {
    "qwen3": {"file": "qwen3.jinja", "special_tokens": QWEN_SPECIALS},
    "qwen3.6": {"file": "qwen3.6.jinja", "special_tokens": QWEN_SPECIALS},
    "llama3_style": {"file": "llama3_style.jinja",
                     "special_tokens": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}},
    "mistral_style": {"file": "mistral_style.jinja", "special_tokens": {"bos_token": "<s>", "eos_token": "</s>",
                                                                       "unk_token": "<unk>"}},
    "parts_style": {"file": "parts_style.jinja", "special_tokens": {"bos_token": "<bos>", "eos_token": "<eos>",
                                                                     "pad_token": "<pad>"}},
    "features": {"file": "features.jinja", "special_tokens": {"eos_token": "</s>"}},
}
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %}: a call block whose output is the body's."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

    def _support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# strftime_now() reads this fixed clock instead of the wall clock, so the corpus does not depend on the
# day it was made; it is written to templates.json, and test_chat_render renders with the same clock.
CLOCK = 1796040000  # 2026-11-30 12:00:00 UTC


def strftime_now(fmt):
    return datetime.fromtimestamp(CLOCK, timezone.utc).strftime(fmt)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[GenerationTag, jinja2.ext.loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now


# ---- vLLM's content-format detection -------------------------------------------------------------
# vllm/renderers/hf.py: _detect_content_format over _iter_nodes_assign_var_or_elems,
# _iter_nodes_assign_messages_item and _iter_nodes_assign_content_item, with PR #42660 (a loop over a
# variable named `content`, outside macros) and PR #53824 (a loop over a macro parameter that a call
# fills with a message's content). vLLM asserts the targets it meets are plain names; a failed
# assertion makes the whole detection fall back to "string", restated here as DetectionError.

class DetectionError(Exception):
    pass


def _plain_target(node):
    if not isinstance(node, jinja2.nodes.Name):
        raise DetectionError(type(node).__name__)
    return node.name


def _var_or_elems(node, names, key=None):
    while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) or (
            isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)):
        node = node.node
    def is_var(n):
        return isinstance(n, jinja2.nodes.Name) and n.ctx == "load" and n.name in names
    if key is None:
        return is_var(node)
    if isinstance(node, jinja2.nodes.Getitem):
        return is_var(node.node) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return is_var(node.node) and node.attr == key
    return False


def _first_content_loop(ast):
    """The first loop (document order) vLLM counts as iterating a message's content, or None."""
    names, queue = {"messages"}, ["messages"]
    while queue:  # variables assigned from messages, transitively (vLLM: breadth first)
        name = queue.pop(0)
        for a in ast.find_all(jinja2.nodes.Assign):
            if _var_or_elems(a.node, {name}):
                target = _plain_target(a.target)
                if target not in names:
                    names.add(target)
                    queue.append(target)
    message_vars = {_plain_target(f.target) for f in ast.find_all(jinja2.nodes.For) if _var_or_elems(f.iter, names)}
    params_of_loop, loops_in_macros = {}, set()
    for macro in ast.find_all(jinja2.nodes.Macro):  # outer macros first, so the innermost one wins
        params = {a.name for a in macro.args}
        fed = set()
        for call in ast.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and _var_or_elems(arg, message_vars, "content"):
                    fed.add(macro.args[i].name)
            for kw in call.kwargs:
                if kw.key in params and _var_or_elems(kw.value, message_vars, "content"):
                    fed.add(kw.key)
        for loop in macro.find_all(jinja2.nodes.For):
            loops_in_macros.add(id(loop))
            if fed:
                params_of_loop[id(loop)] = fed
    for loop in ast.find_all(jinja2.nodes.For):
        it = loop.iter
        if (_var_or_elems(it, message_vars, "content")
                or (isinstance(it, jinja2.nodes.Name) and it.name in params_of_loop.get(id(loop), ()))
                or (id(loop) not in loops_in_macros and isinstance(it, jinja2.nodes.Name) and it.name == "content")):
            _plain_target(loop.target)
            return loop
    return None


def content_format(source):
    try:
        return "openai" if _first_content_loop(ENV.parse(source)) is not None else "string"
    except DetectionError:
        return "string"


# ---- vLLM's pre-processing ---------------------------------------------------------------------------

TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def text_parts(content):
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
            continue
        key = TEXT_KEYS[part["type"]]
        if part.get(key) is not None:
            out.append(part[key])
    return out


def conversation(messages, fmt):
    conv = []
    for msg in messages:
        texts = text_parts(msg.get("content"))
        if fmt == "openai":
            content = [{"type": "text", "text": t} for t in texts]
        else:
            content = "\n".join(t for t in texts if t)
        out = {"role": msg["role"], "content": content}
        if msg["role"] == "assistant":
            if msg.get("tool_calls") is not None:
                out["tool_calls"] = copy.deepcopy(list(msg["tool_calls"]))
            reasoning = msg.get("reasoning")
            if reasoning is None:
                reasoning = msg.get("reasoning_content")
            if reasoning is not None:
                out["reasoning"] = reasoning
                out["reasoning_content"] = reasoning
        elif msg["role"] == "tool":
            if "tool_call_id" in msg:
                out["tool_call_id"] = msg["tool_call_id"]
            if isinstance(out["content"], list):
                out["content"] = "\n".join(p["text"] for p in out["content"]) if out["content"] else ""
        if isinstance(msg.get("name"), str):
            out["name"] = msg["name"]
        if msg["role"] == "developer":
            out["tools"] = msg.get("tools")
        conv.append(out)
    for m in conv:
        if m["role"] == "assistant" and "tool_calls" in m:
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                continue
            if not calls:
                del m["tool_calls"]
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
    return conv


def render(name, source, request, fmt):
    spec = TEMPLATES[name]
    conv = conversation(request["messages"], fmt)
    final = None
    if request.get("continue_final_message"):
        last = conv[-1]
        if isinstance(last["content"], list):
            for block in reversed(last["content"]):
                if "text" in block:
                    final = block["text"]
                    block["text"] += CONTINUE_TAG
                    break
            else:
                raise ValueError("continue_final_message is set but we could not find any text to continue in the final message!")
        else:
            final = last["content"]
            last["content"] += CONTINUE_TAG
    variables = dict(spec["special_tokens"])
    variables.update(request.get("chat_template_kwargs") or {})
    variables.update(messages=conv, tools=request.get("tools"), documents=request.get("documents"),
                     add_generation_prompt=request.get("add_generation_prompt", True))
    text = ENV.from_string(source).render(**variables)
    if final is not None:
        if final.strip() not in text or CONTINUE_TAG.strip() not in text:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat")
        loc = text.rindex(CONTINUE_TAG.strip())
        text = text[:loc] if text[loc:loc + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:loc].rstrip()
    return text


# ---- the conversations ------------------------------------------------------------------------------

TEXTS = [
    "Hello!", "What is the capital of France?", "Explain quicksort in two sentences.",
    "  leading and trailing spaces  ", "line one\nline two\n\nline four", "", " ", "\n",
    "中文问题：今天天气怎么样？", "Emoji 🤖🚀 and accents: café, naïve, Ωmega", "مرحبا بالعالم",
    "Quotes \"double\" and 'single' and back\\slash", "tab\tseparated\tvalues", "trailing newline\n",
    "\u3000ideographic space\u3000", "nbsp\u00a0inside\u00a0and edge\u00a0", "line\u2028separator",
    "<tool_response>\nnot really a tool response\n</tool_response>", "Hi there, what's 2+2?",
    "combining: e\u0301 a\u0308 and zero\u200bwidth", "ends with a question?", "Ünïcödé ÜPPER ß",
    "x" * 300, "a.b.c! ...?", "<think>user pretending</think> hi", "{'json': \"like\", \"n\": 1}",
]
REASONING = [
    "Let me think step by step.\nFirst, 2+2=4.", "\nThe user wants a list.\n", "", "简单的推理。",
    "Considering the tools available, I should call get_weather.", "multi\n\nparagraph\n\nreasoning  ",
]
ANSWERS = [
    "The answer is 4.", "Paris.", "", "Sure! Here is the list:\n- a\n- b", "\n\nLeading newlines answer",
    "<think>\ninline reasoning\n</think>\n\nThe visible answer.", "<think>only reasoning, no close",
    "Mixed </think> close without open", "答案是四。", "Done ✅",
]
SCHEMAS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Search flights. Prices in €; dates ISO-8601.",
        "parameters": {"type": "object", "properties": {
            "legs": {"type": "array", "items": {"type": "object", "properties": {
                "from": {"type": "string"}, "to": {"type": "string"},
                "date": {"type": "string", "format": "date"}}, "required": ["from", "to"]}},
            "passengers": {"type": "object", "properties": {
                "adults": {"type": "integer"}, "children": {"type": "integer", "default": 0}}},
            "max_price": {"type": "number"}, "direct_only": {"type": "boolean"},
            "notes": {"type": ["string", "null"], "description": "free text\nwith newline"}},
            "required": ["legs"]}}},
    {"type": "function", "function": {
        "name": "run_code", "description": "",
        "parameters": {"type": "object", "properties": {
            "language": {"type": "string", "enum": ["python", "c", "日本語"]},
            "source": {"type": "string", "description": "The program; may contain </parameter> text"}},
            "required": ["language", "source"]}}},
    {"type": "function", "function": {"name": "no_params", "description": "Takes nothing."}},
    {"type": "function", "function": {
        "name": "ratio", "parameters": {"type": "object", "properties": {
            "x": {"type": "number"}, "y": {"type": "number"}, "exact": {"type": "boolean"}}}}},
]
ARGS = [
    {"city": "Paris"}, {"city": "São Paulo", "unit": "celsius", "days": 3},
    {"legs": [{"from": "CDG", "to": "NRT", "date": "2025-05-01"}], "passengers": {"adults": 2, "children": 0},
     "max_price": 1234.5, "direct_only": False, "notes": None},
    {"language": "python", "source": "print('hi')\nfor i in range(3):\n    print(i)"},
    {}, {"x": 1.0, "y": 1e-07, "exact": True}, {"x": 100, "y": -0.5, "big": 12345678901234},
    {"nested": {"deep": {"deeper": [1, [2, [3, {"k": "v"}]]]}}, "unicode": "日本語 🎌"},
    {"quote": "he said \"hi\"\\", "ctrl": "a\tb\u0001c"},
]


def rand_content(rng):
    choice = rng.random()
    if choice < 0.12:
        return [{"type": "text", "text": rng.choice(TEXTS)} for _ in range(rng.randint(1, 3))]
    if choice < 0.15:
        return [{"type": "text", "text": rng.choice(TEXTS)}, {"type": "input_text", "text": rng.choice(TEXTS)}]
    return rng.choice(TEXTS)


def tool_call(rng, i):
    args = rng.choice(ARGS)
    fn = {"name": rng.choice(SCHEMAS)["function"]["name"]}
    mode = rng.random()
    if mode < 0.45:
        fn["arguments"] = json.dumps(args, ensure_ascii=rng.random() < 0.5)
    elif mode < 0.8:
        fn["arguments"] = copy.deepcopy(args)
    elif mode < 0.87:
        fn["arguments"] = ""
    elif mode < 0.93:
        fn["arguments"] = "{not json"
    else:
        fn["arguments"] = "[1, 2, {\"a\": null}]"
    return {"id": "call_%09d" % rng.randint(0, 10**9 - 1), "type": "function", "function": fn}


def assistant(rng):
    msg = {"role": "assistant", "content": rng.choice(ANSWERS)}
    r = rng.random()
    if r < 0.3:
        msg["reasoning"] = rng.choice(REASONING)
    elif r < 0.45:
        msg["reasoning_content"] = rng.choice(REASONING)
    elif r < 0.5:
        msg["reasoning"] = None
    if rng.random() < 0.35:
        msg["tool_calls"] = [tool_call(rng, i) for i in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            msg["content"] = None if rng.random() < 0.5 else ""
    if rng.random() < 0.05:
        msg["tool_calls"] = []
    return msg


def tool_results(rng, calls):
    out = []
    for call in calls:
        content = rng.choice(["{\"temperature\": 21.5, \"unit\": \"celsius\"}", "ok", "", "多行\n结果",
                              "<b>html</b> & \"quotes\""])
        if rng.random() < 0.2:
            content = [{"type": "text", "text": content}, {"type": "text", "text": "second part"}]
        out.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return out


def conversation_request(rng, index):
    messages = []
    if rng.random() < 0.55:
        messages.append({"role": "system", "content": rng.choice(TEXTS[:6] + ["You are a helpful assistant.",
                                                                           "Réponds en français.\n"])})
    turns = rng.randint(1, 4)
    for t in range(turns):
        messages.append({"role": "user", "content": rand_content(rng)})
        if rng.random() < 0.1:
            messages[-1]["name"] = "alice"
        if t == turns - 1 and rng.random() < 0.55:
            break
        a = assistant(rng)
        messages.append(a)
        if a.get("tool_calls"):
            messages.extend(tool_results(rng, a["tool_calls"]))
            if rng.random() < 0.6:
                messages.append(assistant(rng))
    request = {"messages": messages, "add_generation_prompt": rng.random() < 0.7}
    if rng.random() < 0.45:
        request["tools"] = rng.sample(SCHEMAS, rng.randint(1, len(SCHEMAS)))
    kwargs = {}
    r = rng.random()
    if r < 0.3:
        kwargs["enable_thinking"] = False
    elif r < 0.55:
        kwargs["enable_thinking"] = True
    if rng.random() < 0.15:
        kwargs["preserve_thinking"] = True
    kwargs["date_string"] = "26 Jul 2024"
    if rng.random() < 0.2:
        kwargs["tools_in_user_message"] = True
    request["chat_template_kwargs"] = kwargs
    if messages[-1]["role"] == "assistant" and isinstance(messages[-1].get("content"), str) \
            and messages[-1]["content"].strip() and rng.random() < 0.5:
        request["continue_final_message"] = True
        request["add_generation_prompt"] = False
    return request


def special_requests():
    """Hand-written edge cases on top of the random ones."""
    reqs = [
        {"messages": [{"role": "user", "content": None}]},
        {"messages": [{"role": "user", "content": []}], "add_generation_prompt": False},
        {"messages": [{"role": "assistant", "content": "no user at all"}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late system"}]},
        {"messages": [{"role": "tool", "tool_call_id": "call_000000001", "content": "orphan result"},
                      {"role": "user", "content": "and?"}]},
        {"messages": [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r1",
                                                         "reasoning_content": "ignored"}],
         "add_generation_prompt": False, "chat_template_kwargs": {"preserve_thinking": True}},
        {"messages": [{"role": "user", "content": "continue me"},
                      {"role": "assistant", "content": "The answer is   "}], "continue_final_message": True,
         "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                   {"type": "refusal", "refusal": "refused part"},
                                                   {"type": "text", "text": None}, "bare string part"]}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": SCHEMAS, "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [{"role": "developer", "content": "dev says", "tools": [SCHEMAS[0]]},
                      {"role": "user", "content": "u"}]},
        {"messages": [{"role": "user", "content": "q"},
                      {"role": "assistant", "content": None,
                       "tool_calls": [{"id": "call_aaaaaaaaa", "type": "function",
                                       "function": {"name": "get_weather", "arguments": None}}]}]},
    ]
    for r in reqs:
        r.setdefault("add_generation_prompt", True)
        r.setdefault("chat_template_kwargs", {"date_string": "26 Jul 2024"})
    return reqs


# ---- content-part lists -----------------------------------------------------------------------------
# Requests whose messages carry lists of text parts in every role, mixed with plain strings: what the
# content format decides. Their own generator (and seed), so the requests above stay as they were.

PARTS = ["First part.", "second part", "", " ", "  spaced  ", "line one\nline two", "trailing newline\n",
         "中文部分", "<think>inside a part</think>", "{\"json\": 1}", "Ünïcödé", "ends without newline"]


def text_part_list(rng, lo=1, hi=4):
    out = []
    for _ in range(rng.randint(lo, hi)):
        text, r = rng.choice(PARTS), rng.random()
        if r < 0.1:
            out.append(text)  # a bare string part
        elif r < 0.2:
            out.append({"type": "input_text", "text": text})
        else:
            out.append({"type": "text", "text": text})
    return out


def string_or_parts(rng, texts, p_parts):
    return text_part_list(rng) if rng.random() < p_parts else rng.choice(texts)


def part_list_request(rng):
    messages = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": string_or_parts(rng, ["You are a helpful assistant.", ""], 0.6)})
    turns = rng.randint(1, 3)
    for t in range(turns):
        messages.append({"role": "user", "content": string_or_parts(rng, TEXTS, 0.7)})
        if t == turns - 1 and rng.random() < 0.5:
            break
        a = assistant(rng)
        if isinstance(a.get("content"), str) and rng.random() < 0.6:
            a["content"] = text_part_list(rng)
            if rng.random() < 0.3:
                a["content"].insert(0, {"type": "text", "text": "<think>\nreasoning in the content\n</think>\n\n"})
        messages.append(a)
        for call in a.get("tool_calls") or []:
            content = string_or_parts(rng, ["ok", "", "{\"temperature\": 21.5}"], 0.6)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    request = {"messages": messages, "add_generation_prompt": rng.random() < 0.7}
    if rng.random() < 0.4:
        request["tools"] = rng.sample(SCHEMAS, rng.randint(1, 2))
    kwargs = {"date_string": "26 Jul 2024"}
    if rng.random() < 0.4:
        kwargs["enable_thinking"] = rng.random() < 0.5
    request["chat_template_kwargs"] = kwargs
    last = messages[-1]
    if last["role"] == "assistant" and isinstance(last.get("content"), list) and \
            any(isinstance(p, dict) and p.get("text", "").strip() for p in last["content"]) and rng.random() < 0.5:
        request["continue_final_message"] = True
        request["add_generation_prompt"] = False
    return request


def part_list_requests():
    rng = random.Random(3606)
    reqs = [part_list_request(rng) for _ in range(60)]
    two = [{"type": "text", "text": "Describe the picture."}, {"type": "text", "text": "Keep it short."}]
    reqs += [
        {"messages": [{"role": "user", "content": two}]},
        {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."},
                                                     {"type": "text", "text": "Answer in English."}]},
                      {"role": "user", "content": two}], "tools": [SCHEMAS[0]]},
        {"messages": [{"role": "user", "content": "plain string first"},
                      {"role": "assistant", "content": [{"type": "text", "text": "<think>\nhidden\n</think>\n\n"},
                                                        {"type": "text", "text": "The visible answer."}]},
                      {"role": "user", "content": [{"type": "text", "text": "and"}, "a bare string part"]}]},
        {"messages": [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}],
                       "tool_calls": [{"id": "call_000000007", "type": "function",
                                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "call_000000007",
                       "content": [{"type": "text", "text": "21 degrees"}, {"type": "text", "text": ""},
                                   {"type": "text", "text": "sunny"}]}], "tools": [SCHEMAS[0]]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": ""}]}]},
        {"messages": [{"role": "user", "content": two},
                      {"role": "assistant", "content": [{"type": "text", "text": "Sure, "},
                                                        {"type": "text", "text": "here it is:"}]}],
         "continue_final_message": True, "add_generation_prompt": False},
        {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "a refusal part"},
                                                   {"type": "output_text", "text": "an output_text part"}]}]},
    ]
    for r in reqs:
        r.setdefault("add_generation_prompt", True)
        r.setdefault("chat_template_kwargs", {"date_string": "26 Jul 2024"})
    return reqs


def has_part_list(request):
    return any(isinstance(m.get("content"), list) for m in request["messages"])


# ---- interpreter cases: single templates over small variables -----------------------------------------

CASES = [
 # whitespace control
 ("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", {}),
 ("  {{- 'x' -}}  \n {# c #}\n  y", {}),
 ("x  {%+ if true %}y{% endif %}  \n  {%- if true +%}\nz{% endif %}", {}),
 ("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}", {}),
 ("{% raw %}{{ x }}{% endraw %}\n{%- raw -%}  {% y %}  {%- endraw %}|", {}),
 ("a {# comment -#}   \n b {#- c #}\nc", {}),
 ("{{ {'a': {'b': 1}}}}", {}),
 ("line1\r\nline2\r{{ 'x' }}\n\n", {}),
 # values and str()
 ("{{ 1/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 0.1+0.2 }} {{ 1e16 }} {{ 123456789012345678.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }}", {}),
 ("{{ [1, 'a', none, true, 1.0, {'k': \"it's\"}] }} {{ (1,) }} {{ ('a', \"b'\\\"\") }}", {}),
 ("{{ ['a\\tb', 'é', '\\x01', '\\u2028', '\\U0001F600'] }}", {}),
 ("{{ '%s-%d' % ('a', 3) }}|{{ '%5.2f|%-4d|%s|%r' % (3.14159, 7, 'a', 'b') }}|{{ '%(x)s' % {'x': 1} }}|{{ '%x%%' % 255 }}", {}),
 ("{{ x }}|{{ x.y }}|{{ x['z'] is defined }}", {"x": {"y": None}}),
 ("{{ 'abc'.foo }}|{{ none }}|{{ true }}|{{ [] }}|{{ {} }}", {}),
 # operators
 ("{{ 'ab' == 'ab' and 1 == 1.0 and true == 1 }} {{ (1,2) == [1,2] }} {{ x == y }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", {}),
 ("{{ true and 'x' }}|{{ false or 0 }}|{{ none or [] }}|{{ 1 and 0 }}|{{ not none }}", {}),
 ("{{ 'ab' * 2 }}{{ [1] * 2 }}{{ 'a' in ['a'] }}{{ 'a' in {'a':1} }}{{ 1 in [1.0] }}{{ 'b' not in 'abc' }}", {}),
 ("{{ 'a' ~ 1 ~ none ~ 2.50 ~ [1] }} {{ 1 + 2 * 3 - 4 / 2 }} {{ -2 ** 2 }} {{ (-2) ** 2 }} {{ 2 ** -1 }} {{ 7.5 % 2 }} {{ -7 % -3 }}", {}),
 ("{{ 3 if false }}|{{ 3 if true else 4 }}|{{ (3 if false) is defined }}|{{ 'y' if x is defined else 'n' }}", {}),
 # slicing and strings
 ("{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}{{ [1,2,3][-1] }}{{ [1,2,3][::-2] }}{{ 'héllo wörld'[-5:] }}{{ 'héllo'[1] }}{{ [1,2,3,4,5][1:-1:2] }}{{ 'abc'[5:] }}|{{ [1,2][5] }}|", {}),
 ("{{ '  x  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'aXbXc'.split('X', 1) }}|{{ 'aXbXc'.rsplit('X', 1) }}|{{ '  a b c '.split(None, 1) }}|{{ ' a b c  '.rsplit(None, 1) }}", {}),
 ("{{ 'xxaxx'.strip('x') }}|{{ 'abc'.startswith(('x','a')) }}|{{ 'abc'.endswith('bc') }}|{{ '\u3000a\u00a0'.strip() }}|{{ 'a\\x1fb\\x1f'.rstrip() }}|{{ 'ab'.lstrip('ba') }}", {}),
 ("{{ 'Hello World'.lower() }} {{ 'straße'.upper() }} {{ 'ΣΑΣ ΟΔΟΣ'.lower() }} {{ 'hello wORLD'.title() }} {{ 'they\\'re bill\\'s'.title() }} {{ 'éCOLE'.capitalize() }}", {}),
 ("{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'aaa'.count('a') }} {{ 'héé'.find('é') }} {{ '-'.join(['a','b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '12'.isdigit() }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }}", {}),
 # filters
 ("{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}{{ ['b','A','a']|sort(case_sensitive=true) }}{{ [1,2,3]|map('string')|join(',') }}{{ [{'a':1},{'a':2}]|map(attribute='a')|list }}{{ [{'a':1},{}]|map(attribute='a', default=0)|list }}", {}),
 ("{{ [1,2,3,4]|select('odd')|list }}{{ [1,None,2]|reject('none')|list }}{{ [{'a':1},{'b':2}]|selectattr('a')|list }}{{ [{'a':1},{'a':2}]|selectattr('a','equalto',2)|list }}{{ [{'a':1},{'a':2}]|rejectattr('a','gt',1)|list }}", {}),
 ("{{ 'x'|default('y') }}{{ u|default('y') }}{{ ''|default('y', true) }}{{ none|default('y') }}{{ u|d }}|", {}),
 ("{{ 'abc' | length }}{{ 'héllo'|length }}{{ 'héllo'|upper }}{{ u|length }}{{ {'a':1}|count }}", {}),
 ("{{ 1.5|int }}{{ '3'|int + 1 }}{{ 'x'|int }}{{ ' 42 '|int }}{{ '3.9'|int }}{{ 'ff'|int(base=16) }}{{ 2.675|round(2) }}{{ 2.5|round }}{{ 3|float }}{{ 'x'|float(1.5) }}{{ -3|abs }}{{ 1.25|round(1, 'ceil') }}", {}),
 ("{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|first }}{{ []|first }}|{{ [3,1]|max }}{{ ['B','a']|min }}{{ [1,2.5]|sum }}{{ [[1],[2]]|sum(start=[]) }}", {}),
 ("{% for k, v in {'b': 1, 'a': 2}|items %}{{ k }}={{ v }};{% endfor %}{{ {'b': 1, 'A': 2}|dictsort }}{{ {'b': 1, 'a': 0}|dictsort(by='value', reverse=true) }}", {}),
 ("{{ 'a b  c'|wordcount }}{{ 'ab'|center(7) }}|{{ 'Hello wORLD-foo(bar'|title }}|{{ 'hello World'|capitalize }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(1, true) }}|{{ 'x\\n\\ny'|indent('> ', blank=true) }}", {}),
 ("{{ [1,2,3]|reverse|list }}{{ 'abc'|reverse }}{{ [1,1,'a','A']|unique|list }}{{ 'a<b>&\"\\''|e }}{{ 5|string ~ 'x' }}{{ ['a','b']|join(attribute=0) }}", {}),
 ("{{ {'b':1,'a':{'d':1,'c':2}}|tojson }}|{{ {'b':1,'a':{'d':1,'c':2}}|tojson(sort_keys=true) }}|{{ [1,[2,3],{}]|tojson(indent=2) }}|{{ {'a':[1]}|tojson(separators=(',',':')) }}|{{ 'é\\n\"\\x7f\\x01'|tojson }}|{{ 'é'|tojson(true) }}|{{ '😀'|tojson(true) }}", {}),
 ("{{ x|tojson }}", {"x": {"f": 1.0, "g": 1e-07, "h": 1e100, "i": -0.0, "j": 123456789, "k": None, "l": True, "m": [], "n": {}}}),
 ("{{ 'Hello'|replace('l', 'L') }}{{ 'aaa'|replace('a', 'b', 2) }}{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'AbC'|lower }}{{ 'AbC'|upper }}", {}),
 # tests
 ("{{ x is iterable }} {{ none is iterable }} {{ {} is sequence }} {{ 'a' is string }} {{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 1.0 is float }} {{ {} is mapping }} {{ [] is mapping }}", {}),
 ("{{ 3 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 2 is even }} {{ 3 is odd }} {{ x is none }} {{ x is not defined }} {{ false is false }} {{ 0 is false }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 1 is eq 1.0 }} {{ 2 is gt 1 }} {{ raise_exception is callable }}", {}),
 # statements
 ("{% set x = 1 %}{% for i in [1,2,3] %}[{{ x }}]{% set x = i*10 %}({{x}}){% endfor %}{{ x }}", {}),
 ("{% for i in [1,2,3] %}[{{ y }}]{% set y = i %}{% endfor %}", {}),
 ("{% macro m() %}{{ a }}{% endmacro %}{% set a = 5 %}{{ m() }}", {}),
 ("{%- macro f(a, b=2) -%}[{{ a }},{{ b }}{{ varargs }}{{ kwargs }}]{%- endmacro -%}{{ f(1) }}{{ f(1, b=3) }}{{ f() }}{{ f(1, 2, 3, z=4) }}", {}),
 ("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}", {}),
 ("{% for a in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('x','y') }};{% endfor %}", {}),
 ("{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [1,2,3] if x != 2 %}{{ loop.index }}/{{ loop.length }};{% endfor %}|{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %}", {}),
 ("{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.depth }}{{ a }}{{ b }}{% endfor %}{{ loop.depth0 }}{% endfor %}{% for k, v in [(1, 2), (3, 4)] %}{{ k + v }}{% endfor %}", {}),
 ("{% set s %}  block {{ 1 }} {% endset %}[{{ s }}]{% set t | upper %}low{% endset %}{{ t }}{% filter upper %}abc{{ 'd' }}{% endfilter %}{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}", {}),
 ("{% for m in ['a', 'a', 'b'] %}{{ loop.changed(m) }}{% endfor %}{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b=2) }}", {}),
 ("{% if false %}a{% elif none %}b{% elif 'x' %}c{% else %}d{% endif %}{% if [] %}e{% endif %}", {}),
 ("{{ d.items()|list }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.get('z') }}{{ d['a'] }}{{ d.a }}", {"d": {"a": 1, "b": [2]}}),
 ("{%- generation -%}gen {{ 1 }}{%- endgeneration %}|{{ messages[0]['content'] }}", {"messages": [{"content": "c"}]}),
 # printf-style: string precision and width in code points, flags, fields longer than any fixed buffer
 ("{{ '%5.3s|%-5s|%05s|%.0s|%3s|%-4r|' % ('abcdef', 'ab', 'ab', 'xyz', '\u00e9', 'q') }}{{ '%-8.3f|%+d|% d|%08.2f|%.f' % (3.14159, 5, 7, -2.5, 2.5) }}", {}),
 ("{{ '%600d' % 5 }}|{{ '%-600s' % 'x' }}|{{ '%.400f' % 1e300 }}", {}),
 ("{{ '%05.3d|%05x|%#x|%#o|%+.3d|%-6x|%#08X|% o|%x|%d|%.0d|%#.3x|%#5o|%+x|% 5d|%-+5d|%0-5d|%i' % (5, -255, -255, 8, 5, -10, 255, 8, true, -2.7, 0, 5, 0, 10, 42, 3, 3, -9) }}", {}),
]
# Rendering fails in Python; the message is kept only for raise_exception().
ERRORS = [
 ("{{ x.y }}", {}), ("{{ {}.y.z }}", {}), ("{{ [1,2][5].x }}", {}), ("{{ 'a' + 1 }}", {}),
 ("{{ 'x' in none }}", {}), ("{{ [1,2].append(3) }}", {}), ("{{ raise_exception('boom: ' ~ 42) }}", {}),
 ("{{ undefined_thing|tojson }}", {}), ("{{ 1 / 0 }}", {}), ("{{ 1 < 'a' }}", {}), ("{{ range(200000)|length }}", {}),
 ("{{ x() }}", {}), ("{% for a, b in [1] %}{% endfor %}", {}), ("{{ 'abc'[::0] }}", {}),
 ("{{ '%99999999999s' % 'a' }}", {}), ("{{ '%.99999999999d' % 1 }}", {}), ("{{ '%x' % 2.5 }}", {}),
 ("{{ '%d' % 'a' }}", {}),
]


def write_jinja_cases():
    with open(os.path.join(DATA, "jinja_cases.jsonl"), "w", encoding="utf-8") as f:
        for src, variables in CASES:
            f.write(json.dumps({"src": src, "vars": variables, "want": ENV.from_string(src).render(**variables)},
                               ensure_ascii=False) + "\n")
        for src, variables in ERRORS:
            case = {"src": src, "vars": variables}
            try:
                ENV.from_string(src).render(**variables)
                raise SystemExit("expected an error: " + src)
            except jinja2.exceptions.TemplateError as e:
                case["error"] = e.message if type(e) is jinja2.exceptions.TemplateError else None
            except (TypeError, ValueError, ZeroDivisionError, OverflowError, MemoryError,
                    jinja2.exceptions.SecurityError):
                case["error"] = None
            f.write(json.dumps(case, ensure_ascii=False) + "\n")


def render_result(name, source, request, fmt, counts):
    """The rendering, {"raises": message} for raise_exception(), or {"fails": error type}."""
    try:
        text = render(name, source, request, fmt)
        counts["ok"] += 1
        return text
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            counts["raise"] += 1
            return {"raises": e.message}  # raise_exception(): exact message
        counts["error"] += 1
        return {"fails": type(e).__name__}
    except (TypeError, ValueError, KeyError, IndexError) as e:
        counts["error"] += 1
        return {"fails": type(e).__name__}


def main():
    rng = random.Random(20240726)
    requests = [conversation_request(rng, i) for i in range(240)] + special_requests() + part_list_requests()
    sources = {name: open(os.path.join(DATA, spec["file"]), encoding="utf-8").read() for name, spec in TEMPLATES.items()}
    formats = {name: content_format(sources[name]) for name in TEMPLATES}
    meta = {name: {"file": spec["file"], "special_tokens": spec["special_tokens"], "content_format": formats[name]}
            for name, spec in TEMPLATES.items()}
    with open(os.path.join(DATA, "templates.json"), "w", encoding="utf-8") as f:
        json.dump({"clock": CLOCK, "templates": meta}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    counts = {"ok": 0, "raise": 0, "error": 0}
    with open(os.path.join(DATA, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for i, req in enumerate(requests):
            # "expected": what vLLM's auto-detected format renders; with part lists, also each explicit
            # --chat-template-content-format.
            line = {"id": i, "request": req,
                    "expected": {name: render_result(name, sources[name], req, formats[name], counts) for name in TEMPLATES}}
            if has_part_list(req):
                line["by_format"] = {name: {fmt: render_result(name, sources[name], req, fmt, counts)
                                            for fmt in ("string", "openai")} for name in TEMPLATES}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    write_jinja_cases()
    print("jinja2", jinja2.__version__, "requests", len(requests), "formats", formats, counts, file=sys.stderr)


if __name__ == "__main__":
    main()
