package tokenize

// Chat templates: /v1/chat/completions messages -> the prompt string vLLM renders, byte
// for byte, so that the router's token ids equal the engine's.
//
// What is reproduced (vLLM's chat_utils/serving_chat and transformers'
// apply_chat_template / render_jinja_template):
//
//   - Message preparation (vLLM _parse_chat_message_content): every message is rebuilt
//     as {role, content[, tool_calls, reasoning, reasoning_content | tool_call_id][,
//     name][, task][, tools]}; other keys are dropped. Content becomes a string ("string"
//     format: the text parts joined with "\n", empty parts skipped, null -> "") or a list
//     of {"type": "text", "text": ...} parts ("openai" format, null -> []). Text-like part
//     types are text, input_text, output_text, refusal, thinking and tool_reference; media
//     parts are refused (the router serves text-only models). Tool messages in openai
//     format get their all-text part lists joined back into a string. Assistant
//     tool_calls are normalised as pydantic validates them ({id, function: {arguments,
//     name}, type}, extra keys dropped), arguments given as a JSON string are decoded
//     (invalid JSON -> {}, null -> {}), an empty tool_calls list is dropped. "reasoning"
//     (or, as in vLLM 0.10/0.11, "reasoning_content") is copied to both keys.
//   - The content format is vLLM's "auto" detection (_detect_content_format): "openai"
//     when the template loops over a message's content (for x in message['content'] /
//     message.content, including through variables assigned from messages and filters
//     or slices of them, or for x in content), otherwise "string".
//   - developer messages become system messages and all system messages are merged into
//     one leading message when the template does not mention 'developer' (vLLM's
//     renderer).
//   - Tools are what vLLM passes after pydantic: [tool.model_dump() ...], i.e. each tool
//     is {"type": "function", "function": {"name", "description", "parameters", extra
//     keys...}, extra keys...} with description/parameters null when absent; tools
//     absent/null -> the template sees None.
//   - Template variables: special tokens (bos/eos/unk/sep/pad/cls/mask_token) overridden
//     by chat_template_kwargs, then messages, tools, documents, add_generation_prompt.
//     chat_template_kwargs may override add_generation_prompt, continue_final_message,
//     tools and documents as vLLM's dict update does; "chat_template" and "tokenize"
//     are refused as vLLM refuses them; kwargs that only affect tokenization (padding,
//     return_dict, ...) are ignored.
//   - continue_final_message trims the rendered text after the final message exactly
//     like transformers; with add_generation_prompt it is an error.
//   - A model whose tokenizer_config.json has a list of named templates uses "default",
//     or "tool_use" when the request has tools (transformers' get_chat_template).
//
// Jinja: templates run on package jinja, kvgate's interpreter of transformers' Jinja
// environment (its doc says why kvgate has its own). Renders are checked byte for byte
// against Python jinja2 plus the vLLM request handling by testdata/templates/gen.py
// (golden.json: real and synthetic templates x conversations; --random: a randomized
// differential matrix; it also writes jinja/testdata/jinja_golden.json, the
// interpreter's conformance cases).
//
// Deviations from vLLM, all deliberate:
//   - image/audio/video content parts are errors (text-only models);
//   - lone UTF-16 surrogates in request JSON become U+FFFD;
//   - strftime_now uses the router's clock and local time zone;
//   - processor chat templates (chat_template.json of multimodal models), vLLM's
//     built-in fallback templates and additional_special_tokens are not used;
//   - where vLLM versions differ, the newest behaviour is reproduced (invalid tool-call
//     arguments -> {} instead of an error, empty tool_calls dropped, developer -> system,
//     tool content lists joined), plus reasoning_content as in 0.10/0.11;
//   - request validation is more lenient than vLLM's pydantic models (e.g. a tool call
//     without "id", non-string document fields render instead of being refused);
//   - the interpreter's limits (package jinja): macro recursion is limited to 200 levels
//     and a render to 5,000,000 loop iterations and macro calls (Python's limit is its
//     recursion depth only).

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/kvgate/kvgate/tokenize/jinja"
)

// ErrNoChatTemplate is returned (wrapped) by LoadChatTemplate for a model without one.
var ErrNoChatTemplate = errors.New("model has no chat template")

// TemplateError is a template's own raise_exception (or a render error a user caused);
// gateways answer 400 with its message.
type TemplateError struct{ Message string }

func (e *TemplateError) Error() string { return "chat template: " + e.Message }

// ChatRequest is the part of an OpenAI chat completion request that shapes the prompt.
type ChatRequest struct {
	Messages             json.RawMessage // the OpenAI messages array, as received
	Tools                json.RawMessage // optional tools array; null/absent -> the template sees None, as vLLM passes it
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	Documents            json.RawMessage // optional
	Kwargs               json.RawMessage // optional chat_template_kwargs object, e.g. {"enable_thinking": false}
}

type contentFormat uint8

const (
	formatString contentFormat = iota
	formatOpenAI
)

// ChatTemplate is a parsed chat template plus the special tokens it may reference.
// Safe for concurrent use.
type ChatTemplate struct {
	tpl               *jinja.Template
	format            contentFormat
	supportsDeveloper bool
	usesMessages      bool
	special           []templateVar // the special tokens, sorted by name
	toolUse           *ChatTemplate
	now               func() time.Time // the clock of strftime_now; nil: time.Now
}

// templateVar is a variable of a render: a special token (bos_token, ...) or a key of
// chat_template_kwargs.
type templateVar struct {
	name string
	v    jinja.Value
}

// ParseChatTemplate parses a Jinja chat template. special maps special-token names
// (bos_token, eos_token, ...) to their text; they are visible to the template.
func ParseChatTemplate(source string, special map[string]string) (*ChatTemplate, error) {
	var extra []templateVar
	names := make([]string, 0, len(special))
	for k := range special {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		extra = append(extra, templateVar{name: k, v: jinja.StringValue(special[k])})
	}
	return parseChatTemplate(source, extra)
}

func parseChatTemplate(source string, special []templateVar) (*ChatTemplate, error) {
	tpl, err := jinja.Parse(source)
	if err != nil {
		return nil, fmt.Errorf("parse chat template: %w", err)
	}
	return &ChatTemplate{
		tpl:               tpl,
		format:            detectContentFormat(tpl),
		supportsDeveloper: strings.Contains(source, `"developer"`) || strings.Contains(source, `'developer'`),
		usesMessages:      tpl.References("messages"),
		special:           special,
	}, nil
}

// LoadChatTemplate reads dir/chat_template.jinja, else chat_template from
// dir/tokenizer_config.json, and bos_token/eos_token/unk_token/pad_token (and
// sep/cls/mask_token) from tokenizer_config.json (string or {"content": ...} form).
// It returns ErrNoChatTemplate (wrapped) when the model has none.
func LoadChatTemplate(dir string) (*ChatTemplate, error) {
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("load chat template: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("load chat template: %s is not a directory", dir)
	}
	var special []templateVar
	named := map[string]string{}
	defaultSrc, haveDefault := "", false

	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	raw, err := os.ReadFile(cfgPath)
	switch {
	case err == nil:
		var cfg map[string]json.RawMessage
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return nil, fmt.Errorf("load chat template: %s: %w", cfgPath, err)
		}
		for _, name := range []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"} {
			tok, ok, err := specialToken(cfg[name])
			if err != nil {
				return nil, fmt.Errorf("load chat template: %s: %s: %w", cfgPath, name, err)
			}
			if ok {
				special = append(special, templateVar{name: name, v: jinja.StringValue(tok)})
			}
		}
		if ct, ok := cfg["chat_template"]; ok && string(ct) != "null" {
			var s string
			if err := json.Unmarshal(ct, &s); err == nil {
				defaultSrc, haveDefault = s, true
			} else {
				var list []struct {
					Name     string `json:"name"`
					Template string `json:"template"`
				}
				if err := json.Unmarshal(ct, &list); err != nil {
					return nil, fmt.Errorf("load chat template: %s: chat_template is neither a string nor a list of {name, template}: %w", cfgPath, err)
				}
				for _, t := range list {
					named[t.Name] = t.Template
				}
			}
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return nil, fmt.Errorf("load chat template: %w", err)
	}

	jinjaPath := filepath.Join(dir, "chat_template.jinja")
	if b, err := os.ReadFile(jinjaPath); err == nil {
		defaultSrc, haveDefault = string(b), true
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load chat template: %w", err)
	}
	if entries, err := os.ReadDir(filepath.Join(dir, "additional_chat_templates")); err == nil {
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".jinja") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, "additional_chat_templates", e.Name()))
			if err != nil {
				return nil, fmt.Errorf("load chat template: %w", err)
			}
			named[strings.TrimSuffix(e.Name(), ".jinja")] = string(b)
		}
	}
	if !haveDefault {
		if s, ok := named["default"]; ok {
			defaultSrc, haveDefault = s, true
		}
	}
	if !haveDefault {
		if len(named) > 0 {
			return nil, fmt.Errorf("load chat template: %s: the model has several chat templates and none is named \"default\"", dir)
		}
		return nil, fmt.Errorf("load chat template: %s: %w", dir, ErrNoChatTemplate)
	}
	c, err := parseChatTemplate(defaultSrc, special)
	if err != nil {
		return nil, fmt.Errorf("load chat template: %s: %w", dir, err)
	}
	if src, ok := named["tool_use"]; ok {
		if c.toolUse, err = parseChatTemplate(src, special); err != nil {
			return nil, fmt.Errorf("load chat template: %s: tool_use: %w", dir, err)
		}
	}
	return c, nil
}

// specialToken reads a special token in string or AddedToken ({"content": ...}) form.
func specialToken(raw json.RawMessage) (string, bool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", false, err
	}
	if obj.Content == nil {
		return "", false, errors.New("token object without content")
	}
	return *obj.Content, true, nil
}

// ---- rendering ----

func userErrorf(format string, args ...any) error {
	return &TemplateError{Message: fmt.Sprintf(format, args...)}
}

// Render renders the chat template for a request exactly as vLLM would before
// tokenizing it (with add_special_tokens=False).
func (c *ChatTemplate) Render(req ChatRequest) (out string, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("chat template: internal error: %v\n%s", p, debug.Stack())
		}
	}()
	if req.ContinueFinalMessage && req.AddGenerationPrompt {
		return "", userErrorf("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	msgsV, err := decodeRequestJSON("messages", req.Messages)
	if err != nil {
		return "", err
	}
	if msgsV.Kind() != jinja.KindList {
		return "", userErrorf("messages must be an array")
	}
	tools := jinja.NoneValue()
	if present(req.Tools) {
		tv, err := decodeRequestJSON("tools", req.Tools)
		if err != nil {
			return "", err
		}
		if tools, err = normalizeTools(tv); err != nil {
			return "", err
		}
	}
	documents := jinja.NoneValue()
	if present(req.Documents) {
		dv, err := decodeRequestJSON("documents", req.Documents)
		if err != nil {
			return "", err
		}
		documents = dv
	}
	var kwargs *jinja.Dict
	if present(req.Kwargs) {
		kv, err := decodeRequestJSON("chat_template_kwargs", req.Kwargs)
		if err != nil {
			return "", err
		}
		if kv.Kind() != jinja.KindDict {
			return "", userErrorf("chat_template_kwargs must be an object")
		}
		kwargs = kv.Dict()
	}
	addGen := jinja.BoolValue(req.AddGenerationPrompt)
	contFinal := req.ContinueFinalMessage
	var vars []templateVar
	if kwargs != nil {
		var unexpected []string
		for k, v := range kwargs.All() {
			switch k.String() {
			case "chat_template", "tokenize":
				unexpected = append(unexpected, k.Repr())
			case "add_generation_prompt":
				addGen = v
			case "continue_final_message":
				contFinal = v.Truth()
			case "tools":
				tools = v
			case "documents":
				documents = v
			case "conversation", "messages":
				if k.String() == "messages" && !c.usesMessages {
					continue
				}
				return "", userErrorf("got multiple values for keyword argument '%s'", k.String())
			case "padding", "truncation", "max_length", "return_tensors", "return_dict",
				"return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs":
			default:
				vars = append(vars, templateVar{name: k.String(), v: v})
			}
		}
		if len(unexpected) > 0 {
			return "", userErrorf("Found unexpected chat template kwargs from request: {%s}", strings.Join(unexpected, ", "))
		}
	}
	// Request values come from JSON, so the only iterable that is neither a str nor a
	// dict is a list.
	if documents.Kind() != jinja.KindNone {
		if documents.Kind() != jinja.KindList {
			return "", userErrorf("documents must be an array")
		}
		for _, d := range documents.Items() {
			if d.Kind() != jinja.KindDict {
				return "", userErrorf("Documents should be a list of dicts with 'title' and 'text' keys!")
			}
		}
	}
	if tools.Kind() != jinja.KindNone {
		if tools.Kind() != jinja.KindList {
			return "", userErrorf("tools must be an array")
		}
		for _, t := range tools.Items() {
			if t.Kind() != jinja.KindDict {
				return "", userErrorf("Tools should either be a JSON schema, or a callable function with type hints and a docstring suitable for auto-conversion to a schema.")
			}
		}
	}
	tpl := c
	if tools.Kind() != jinja.KindNone && c.toolUse != nil {
		tpl = c.toolUse
	}
	conv, err := buildConversation(msgsV.Items(), tpl.format)
	if err != nil {
		return "", err
	}
	if !tpl.supportsDeveloper {
		if conv, err = convertDeveloper(conv); err != nil {
			return "", err
		}
	}
	if len(conv) == 0 {
		return "", userErrorf("list index out of range")
	}
	if contFinal && addGen.Truth() {
		return "", userErrorf("continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead.")
	}

	var vs jinja.Vars
	vs.Grow(len(tpl.special) + len(vars) + 4)
	for _, g := range tpl.special {
		vs.Set(g.name, g.v)
	}
	for _, g := range vars {
		vs.Set(g.name, g.v)
	}
	vs.Set("messages", jinja.ListValue(conv))
	vs.Set("tools", tools)
	vs.Set("documents", documents)
	vs.Set("add_generation_prompt", addGen)
	rendered, err := tpl.tpl.Render(&vs, jinja.Options{Now: tpl.now, SizeHint: 1024 + len(req.Messages) + len(req.Tools)})
	if err != nil {
		return "", renderError(err)
	}
	if contFinal {
		if rendered, err = continueFinal(rendered, conv[len(conv)-1]); err != nil {
			return "", err
		}
	}
	return rendered, nil
}

// renderError maps interpreter errors to the API's errors: a template's exception is
// the user's (400).
func renderError(err error) error {
	var je *jinja.Error
	if errors.As(err, &je) {
		return &TemplateError{Message: je.Message}
	}
	return fmt.Errorf("chat template: %w", err)
}

func present(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null"
}

func decodeRequestJSON(field string, raw json.RawMessage) (jinja.Value, error) {
	v, err := jinja.DecodeJSON(raw)
	if err != nil {
		return jinja.Value{}, userErrorf("invalid %s: %s", field, err.Error())
	}
	return v, nil
}

// continueFinal applies transformers' continue_final_message trimming.
func continueFinal(rendered string, last jinja.Value) (string, error) {
	content, _ := last.Dict().Get("content")
	final := ""
	switch content.Kind() {
	case jinja.KindString:
		final = content.String()
	case jinja.KindList:
		found := false
		items := content.Items()
		for i := len(items) - 1; i >= 0; i-- {
			if items[i].Kind() != jinja.KindDict {
				continue
			}
			if t, ok := items[i].Dict().Get("text"); ok {
				if t.Kind() != jinja.KindString {
					return "", userErrorf("'%s' object has no attribute 'strip'", t.TypeName())
				}
				final, found = t.String(), true
				break
			}
		}
		if !found {
			return "", userErrorf("continue_final_message is set but we could not find any text to continuein the final message!")
		}
	default:
		return "", userErrorf("continue_final_message: the final message has no text content")
	}
	stripped := strings.TrimFunc(final, pyIsSpace)
	if !strings.Contains(rendered, stripped) {
		return "", userErrorf("continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible.")
	}
	loc := strings.LastIndex(rendered, stripped)
	lstripped := strings.TrimLeftFunc(final, pyIsSpace)
	if end := loc + len(lstripped); end <= len(rendered) && rendered[loc:end] == final {
		return rendered[:end], nil
	}
	return rendered[:loc+len(stripped)], nil
}

// pyIsSpace is Python's str.isspace for one character, as str.strip uses it.
func pyIsSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || (r >= '\t' && r <= '\r') || (r >= 0x1c && r <= 0x1f)
	}
	return unicode.IsSpace(r)
}
