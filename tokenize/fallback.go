package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/zeebo/xxh3"
)

// HTTPRemote tokenizes on the model's workers through vLLM's POST
// /tokenize, trying each endpoint in turn.
type HTTPRemote struct {
	// Client sends the requests; nil means http.DefaultClient. Give it a
	// timeout: a tokenization that waits on a busy worker delays routing.
	Client *http.Client
	// Endpoints returns base URLs ("http://10.0.0.7:8000") of workers
	// serving model.
	Endpoints func(model string) []string
	// MaxResponse caps a response body (default 64 MiB).
	MaxResponse int64
}

// tokenizeRequest is the body of vLLM's /tokenize: a completion prompt or
// chat messages.
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt,omitempty"`
	Messages             json.RawMessage `json:"messages,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	Documents            json.RawMessage `json:"documents,omitempty"`
	AddSpecialTokens     bool            `json:"add_special_tokens"`
}

type tokenizeResponse struct {
	Tokens *[]uint32 `json:"tokens"`
}

// Tokenize implements Remote.
func (h *HTTPRemote) Tokenize(ctx context.Context, model string, req Request) ([]uint32, error) {
	body := tokenizeRequest{Model: model}
	if req.Chat == nil {
		body.Prompt = &req.Text
		body.AddSpecialTokens = req.AddSpecialTokens == nil || *req.AddSpecialTokens
	} else {
		c := req.Chat
		gen := c.AddGenerationPrompt
		body.Messages, body.Tools, body.AddGenerationPrompt = c.Messages, c.Tools, &gen
		body.ContinueFinalMessage, body.ChatTemplateKwargs, body.Documents = c.ContinueFinalMessage, c.Kwargs, c.Documents
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("remote tokenize: %w", err)
	}
	var endpoints []string
	if h.Endpoints != nil {
		endpoints = h.Endpoints(model)
	}
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("remote tokenize: no worker endpoint for model %q", model)
	}
	var errs []error
	for _, base := range endpoints {
		ids, err := h.post(ctx, strings.TrimRight(base, "/")+"/tokenize", payload)
		if err == nil {
			return ids, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("remote tokenize: %w", errors.Join(errs...))
}

func (h *HTTPRemote) post(ctx context.Context, url string, payload []byte) ([]uint32, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	defer resp.Body.Close()
	limit := h.MaxResponse
	if limit <= 0 {
		limit = 64 << 20
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: read: %w", url, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: response larger than %d bytes", url, limit)
	}
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(data))
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		return nil, fmt.Errorf("%s: status %d: %s", url, resp.StatusCode, msg)
	}
	var out tokenizeResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: decode response: %w", url, err)
	}
	if out.Tokens == nil {
		return nil, fmt.Errorf("%s: response has no tokens", url)
	}
	return *out.Tokens, nil
}

// approximate cuts the prompt's bytes into pseudo-blocks of blockBytes and
// hashes each, seeded by the served model name (so adapters and models
// never share pseudo-blocks). Only full pseudo-blocks count, as only full
// KV blocks do. A chat prompt is first put in a canonical form (tools,
// then each message's role and text), so that the same conversation sent
// with different JSON spacing or key order still maps to the same blocks.
func approximate(req Request, model string, blockBytes int) ([]uint64, error) {
	text := []byte(req.Text)
	if req.Chat != nil {
		var err error
		if text, err = canonicalChat(*req.Chat); err != nil {
			return nil, err
		}
	}
	seed := xxh3.HashString("kvgate-approximate\x00" + model)
	out := make([]uint64, 0, len(text)/blockBytes)
	for i := 0; i+blockBytes <= len(text); i += blockBytes {
		out = append(out, xxh3.HashSeed(text[i:i+blockBytes], seed))
	}
	return out, nil
}

// canonicalChat renders a chat request as text for pseudo-blocks: the
// compacted tools JSON, then per message its role, a NUL, its text (text
// parts joined by newlines; other parts as compacted JSON) and a NUL.
func canonicalChat(c ChatRequest) ([]byte, error) {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(c.Messages, &msgs); err != nil {
		return nil, fmt.Errorf("%w: messages: %v", ErrBadRequest, err)
	}
	var b bytes.Buffer
	if len(c.Tools) > 0 && string(c.Tools) != "null" {
		if err := json.Compact(&b, c.Tools); err != nil {
			return nil, fmt.Errorf("%w: tools: %v", ErrBadRequest, err)
		}
		b.WriteByte(0)
	}
	for i, m := range msgs {
		b.WriteString(m.Role)
		b.WriteByte(0)
		if err := contentText(&b, m.Content); err != nil {
			return nil, fmt.Errorf("%w: messages[%d].content: %v", ErrBadRequest, i, err)
		}
		b.WriteByte(0)
	}
	return b.Bytes(), nil
}

func contentText(b *bytes.Buffer, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		b.WriteString(s)
		return nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return errors.New("want a string or an array of parts")
	}
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('\n')
		}
		var tp struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(p, &tp); err == nil && tp.Type == "text" && tp.Text != nil {
			b.WriteString(*tp.Text)
			continue
		}
		if err := json.Compact(b, p); err != nil {
			return err
		}
	}
	return nil
}
