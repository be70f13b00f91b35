package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvgate/kvgate/tokenize"
)

// maxTokenizeLine caps one input line of `kvgate tokenize`.
const maxTokenizeLine = 64 << 20

// tokenizeInput is one line of `kvgate tokenize`: a completion prompt
// (text) or a chat (messages).
type tokenizeInput struct {
	Text                 *string         `json:"text"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	Documents            json.RawMessage `json:"documents"`
}

func newTokenizeCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "tokenize",
		Short: "Tokenize JSON lines from stdin as the engine would (to check kvgate's ids against yours)",
		Long: `Reads one JSON object per line from stdin and writes one line per input:
{"ids": [...]} or {"error": "..."}.

  {"text": "...", "add_special_tokens": true}         a completion prompt (special tokens added unless false)
  {"messages": [...], "tools": [...],
   "add_generation_prompt": true,
   "chat_template_kwargs": {...}}                      a chat, through the model's chat template

Defaults follow vLLM: completions add special tokens, chats do not (the
template emits them) and add the generation prompt unless it is false or
continue_final_message is true.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("tokenize: --tokenizer DIR is required")
			}
			reg, err := tokenize.NewRegistry(tokenize.Config{Models: []tokenize.ModelConfig{{
				Name: "cli", Tokenizer: dir, Fallbacks: []tokenize.Path{tokenize.PathLocal},
			}}}, tokenize.RegistryOptions{Strict: true})
			if err != nil {
				return fmt.Errorf("tokenize: %w", err)
			}
			return tokenizeLines(cmd.Context(), reg, "cli", cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dir, "tokenizer", "", "model directory with tokenizer.json (and tokenizer_config.json / chat_template.jinja)")
	return cmd
}

// tokenizeLines answers each input line of r on w. A bad line gets an
// error line; only failing to read or write stops it.
func tokenizeLines(ctx context.Context, reg *tokenize.Registry, model string, r io.Reader, w io.Writer) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTokenizeLine)
	out := bufio.NewWriter(w)
	var buf []byte
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		buf = buf[:0]
		ids, err := tokenizeLine(ctx, reg, model, line)
		if err != nil {
			msg, _ := json.Marshal(err.Error())
			buf = append(append(append(buf, `{"error":`...), msg...), "}\n"...)
		} else {
			buf = append(buf, `{"ids":[`...)
			for i, id := range ids {
				if i > 0 {
					buf = append(buf, ',')
				}
				buf = strconv.AppendUint(buf, uint64(id), 10)
			}
			buf = append(buf, "]}\n"...)
		}
		if _, err := out.Write(buf); err != nil {
			return fmt.Errorf("tokenize: write: %w", err)
		}
	}
	if err := sc.Err(); err != nil {
		out.Flush()
		return fmt.Errorf("tokenize: read stdin: %w", err)
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("tokenize: write: %w", err)
	}
	return nil
}

func tokenizeLine(ctx context.Context, reg *tokenize.Registry, model string, line []byte) ([]uint32, error) {
	var in tokenizeInput
	if err := json.Unmarshal(line, &in); err != nil {
		return nil, fmt.Errorf("bad input line: %v", err)
	}
	hasMessages := len(in.Messages) > 0 && string(in.Messages) != "null"
	req := tokenize.Request{Model: model}
	switch {
	case in.Text != nil && hasMessages:
		return nil, errors.New(`bad input line: give "text" or "messages", not both`)
	case in.Text != nil:
		req.Text, req.AddSpecialTokens = *in.Text, in.AddSpecialTokens
	case hasMessages:
		gen := !in.ContinueFinalMessage
		if in.AddGenerationPrompt != nil {
			gen = *in.AddGenerationPrompt
		}
		req.Chat = &tokenize.ChatRequest{Messages: in.Messages, Tools: in.Tools, AddGenerationPrompt: gen,
			ContinueFinalMessage: in.ContinueFinalMessage, Documents: in.Documents, Kwargs: in.ChatTemplateKwargs}
	default:
		return nil, errors.New(`bad input line: want "text" or "messages"`)
	}
	res, err := reg.Tokenize(ctx, req)
	if err != nil {
		return nil, err
	}
	return res.Tokens, nil
}
