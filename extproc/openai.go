package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvgate/kvgate/tokenize"
)

// Error is a request the gateway refuses, answered as OpenAI does:
// {"error": {"message", "type", "param", "code"}} with Status.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Body returns the error's JSON body.
func (e *Error) Body() []byte {
	typ := "InternalServerError"
	switch e.Status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		typ = "BadRequestError"
	case http.StatusNotFound:
		typ = "NotFoundError"
	case http.StatusTooManyRequests:
		typ = "RateLimitError"
	case http.StatusServiceUnavailable:
		typ = "ServiceUnavailableError"
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": e.Message, "type": typ, "param": nil, "code": e.Status}})
	return b
}

func errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// Kind is what a request asks for, by its path.
type Kind uint8

// The request kinds the gateway understands.
const (
	KindOther      Kind = iota // anything else: routed on load only
	KindCompletion             // /v1/completions
	KindChat                   // /v1/chat/completions
	KindResponses              // /v1/responses
	KindEmbeddings             // /v1/embeddings: routed on load only
)

// kindOf maps a request path (query string ignored) to its kind.
func kindOf(path string) Kind {
	path, _, _ = strings.Cut(path, "?")
	switch strings.TrimSuffix(path, "/") {
	case "/v1/completions":
		return KindCompletion
	case "/v1/chat/completions":
		return KindChat
	case "/v1/responses":
		return KindResponses
	case "/v1/embeddings":
		return KindEmbeddings
	}
	return KindOther
}

// Prompt is a parsed request body: the model and what to tokenize.
type Prompt struct {
	Kind  Kind
	Model string
	// Stream is the client's "stream" flag.
	Stream bool
	// Tokenize is the prompt to tokenize (Text or Chat), unless IDs are
	// given or the request is load-only.
	Tokenize tokenize.Request
	// IDs are a completion prompt's token ids, given by the client.
	IDs []uint32
	// LoadOnly requests are routed on load, not cache overlap.
	LoadOnly bool
	// Bytes is the prompt's size, for load-only requests' length estimate.
	Bytes int
}

// members are the top-level members of an OpenAI request body the gateway
// reads, raw (aliasing the body); everything else passes through
// untouched. Keys match as encoding/json matches struct fields: exactly or
// case-insensitively, the last occurrence winning.
type members struct {
	model, prompt, stream, addSpecialTokens                    []byte
	messages, tools, addGenerationPrompt, continueFinalMessage []byte
	chatTemplateKwargs, documents, input, instructions         []byte
}

func (m *members) set(key string, raw []byte) {
	for _, f := range [...]struct {
		name string
		dst  *[]byte
	}{
		{"model", &m.model}, {"prompt", &m.prompt}, {"stream", &m.stream}, {"add_special_tokens", &m.addSpecialTokens},
		{"messages", &m.messages}, {"tools", &m.tools}, {"add_generation_prompt", &m.addGenerationPrompt},
		{"continue_final_message", &m.continueFinalMessage}, {"chat_template_kwargs", &m.chatTemplateKwargs},
		{"documents", &m.documents}, {"input", &m.input}, {"instructions", &m.instructions},
	} {
		if len(key) == len(f.name) && strings.EqualFold(key, f.name) {
			*f.dst = raw
			return
		}
	}
}

// decode decodes the member raw (when present) into v, as encoding/json
// would have decoded it as a struct field named name.
func decode(name string, raw []byte, v any) error {
	if raw == nil {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// ParsePrompt reads an OpenAI request body for path. Errors are 400s.
func ParsePrompt(path string, body []byte) (Prompt, *Error) {
	p := Prompt{Kind: kindOf(path), Bytes: len(body)}
	if len(bytes.TrimSpace(body)) == 0 {
		return p, errorf(http.StatusBadRequest, "request body is empty; want a JSON object")
	}
	bad := func(err error) *Error {
		return errorf(http.StatusBadRequest, "invalid JSON body: %s", strings.ReplaceAll(err.Error(), "json: ", ""))
	}
	var m members
	if err := scanObject(body, m.set); err != nil {
		return p, bad(err)
	}
	var model string
	if err := errors.Join(decode("model", m.model, &model), decode("stream", m.stream, &p.Stream)); err != nil {
		return p, bad(err)
	}
	p.Model = model
	switch p.Kind {
	case KindCompletion:
		var add *bool
		if err := decode("add_special_tokens", m.addSpecialTokens, &add); err != nil {
			return p, bad(err)
		}
		text, ids, e := completionPrompt(m.prompt)
		if e != nil {
			return p, e
		}
		p.IDs = ids
		p.Tokenize = tokenize.Request{Text: text, AddSpecialTokens: add}
	case KindChat:
		var gen *bool
		var cont bool
		if err := errors.Join(decode("add_generation_prompt", m.addGenerationPrompt, &gen),
			decode("continue_final_message", m.continueFinalMessage, &cont)); err != nil {
			return p, bad(err)
		}
		if !present(m.messages) {
			return p, errorf(http.StatusBadRequest, "messages is required")
		}
		addGen := gen == nil || *gen
		if cont && gen == nil {
			addGen = false // vLLM: continue_final_message and add_generation_prompt exclude each other
		}
		p.Tokenize = tokenize.Request{Chat: &tokenize.ChatRequest{
			Messages: m.messages, Tools: nullToNil(m.tools), AddGenerationPrompt: addGen,
			ContinueFinalMessage: cont, Documents: nullToNil(m.documents), Kwargs: nullToNil(m.chatTemplateKwargs),
		}}
	case KindResponses:
		var instructions *string
		if err := decode("instructions", m.instructions, &instructions); err != nil {
			return p, bad(err)
		}
		msgs, e := responsesMessages(instructions, m.input)
		if e != nil {
			return p, e
		}
		p.Tokenize = tokenize.Request{Chat: &tokenize.ChatRequest{Messages: msgs, Tools: responsesTools(m.tools), AddGenerationPrompt: true}}
	default:
		p.LoadOnly = true
	}
	if p.Model == "" {
		return p, errorf(http.StatusBadRequest, "model is required")
	}
	p.Tokenize.Model = p.Model
	return p, nil
}

func present(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

func nullToNil(raw json.RawMessage) json.RawMessage {
	if !present(raw) {
		return nil
	}
	return raw
}

// completionPrompt reads a completion's prompt: a string, a list of token
// ids, or a list of either (a batch; the first prompt routes it, as every
// prompt of a batch goes to the same engine).
func completionPrompt(raw json.RawMessage) (string, []uint32, *Error) {
	if !present(raw) {
		return "", nil, errorf(http.StatusBadRequest, "prompt is required")
	}
	// raw is valid JSON (ParsePrompt scanned the body): its first byte
	// says what it is, and encoding/json need not scan a long list of ids
	// only to find that it is not a string.
	if b := bytes.TrimLeft(raw, " \t\r\n"); len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, errorf(http.StatusBadRequest, "prompt: %v", err)
		}
		return s, nil, nil
	}
	ids, ok := tokenIDs(raw)
	if ok || json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, errorf(http.StatusBadRequest, "prompt is empty")
		}
		return "", ids, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) == 0 {
			return "", nil, errorf(http.StatusBadRequest, "prompt is an empty list")
		}
		return texts[0], nil, nil
	}
	var lists [][]uint32
	if json.Unmarshal(raw, &lists) == nil {
		if len(lists) == 0 || len(lists[0]) == 0 {
			return "", nil, errorf(http.StatusBadRequest, "prompt is empty")
		}
		return "", lists[0], nil
	}
	return "", nil, errorf(http.StatusBadRequest, "prompt: want a string, a list of strings, a list of token ids (non-negative integers) or a list of such lists")
}

// responsesMessages turns a Responses API request's instructions and input
// into chat messages, as vLLM does before applying the chat template:
// instructions become a system message, a string input one user message,
// and input message items keep their role with input_text / output_text
// parts as text. Other items (function calls and their outputs, reasoning)
// keep their type and fields, as the template may render them.
func responsesMessages(instructions *string, input json.RawMessage) (json.RawMessage, *Error) {
	if !present(input) {
		return nil, errorf(http.StatusBadRequest, "input is required")
	}
	var msgs []map[string]any
	if instructions != nil {
		msgs = append(msgs, map[string]any{"role": "system", "content": *instructions})
	}
	var s string
	if json.Unmarshal(input, &s) == nil {
		msgs = append(msgs, map[string]any{"role": "user", "content": s})
		return mustJSON(msgs), nil
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, errorf(http.StatusBadRequest, "input: want a string or a list of items")
	}
	for i, it := range items {
		var role, typ string
		_ = json.Unmarshal(it["role"], &role)
		_ = json.Unmarshal(it["type"], &typ)
		switch {
		case role != "":
			m := map[string]any{"role": role}
			var text string
			if json.Unmarshal(it["content"], &text) == nil {
				m["content"] = text
			} else {
				var parts []map[string]any
				if err := json.Unmarshal(it["content"], &parts); err != nil {
					return nil, errorf(http.StatusBadRequest, "input[%d].content: want a string or a list of parts", i)
				}
				for _, p := range parts {
					if t, _ := p["type"].(string); t == "input_text" || t == "output_text" {
						p["type"] = "text"
					}
				}
				m["content"] = parts
			}
			msgs = append(msgs, m)
		case typ != "":
			m := map[string]any{}
			for k, v := range it {
				m[k] = v
			}
			msgs = append(msgs, m)
		default:
			return nil, errorf(http.StatusBadRequest, "input[%d]: an item needs a role or a type", i)
		}
	}
	return mustJSON(msgs), nil
}

// responsesTools converts Responses API function tools ({"type":
// "function", "name", "parameters", ...}) to the chat form ({"type":
// "function", "function": {...}}) the templates expect.
func responsesTools(raw json.RawMessage) json.RawMessage {
	if !present(raw) {
		return nil
	}
	var tools []map[string]any
	if json.Unmarshal(raw, &tools) != nil {
		return raw
	}
	for i, t := range tools {
		if t["type"] == "function" && t["function"] == nil {
			fn := map[string]any{}
			for k, v := range t {
				if k != "type" {
					fn[k] = v
				}
			}
			tools[i] = map[string]any{"type": "function", "function": fn}
		}
	}
	return mustJSON(tools)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("extproc: marshal %T: %v", v, err)) // values built from decoded JSON always encode
	}
	return b
}
