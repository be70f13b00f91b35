package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Outcome is what happened to one request.
type Outcome struct {
	Line int // trace line
	// Scheduled is when the request was due and Sent when it was sent,
	// both from the start of the run (wall clock).
	Scheduled, Sent time.Duration
	// TTFT is the time from sending to the first content chunk, E2E to
	// [DONE].
	TTFT, E2E time.Duration
	// From the response's usage.
	PromptTokens, CachedTokens, OutputTokens int
	Status                                   int
	// Err is why the request failed ("" when it completed).
	Err string
}

// OK reports whether the request completed.
func (o Outcome) OK() bool { return o.Err == "" }

// Loader replays requests against an OpenAI-compatible endpoint.
type Loader struct {
	Client        *http.Client
	URL           string // base URL, e.g. http://127.0.0.1:8080
	Model         string
	TokensPerHash int
	MaxTokens     int           // caps output_length; 0: no cap
	Timeout       time.Duration // per request; 0: none
}

// newClient returns a client for many concurrent streams to one host,
// never through an HTTP proxy from the environment.
func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}}
}

// maxTokens is the max_tokens sent for r.
func (l *Loader) maxTokens(r Request) int {
	if l.MaxTokens > 0 {
		return min(r.OutputLength, l.MaxTokens)
	}
	return r.OutputLength
}

// Run sends every request at start + At/compression (open loop: a slow
// answer does not delay the next request), waits for all to end and
// returns their outcomes in the order of reqs. done is called after each
// request ends. When ctx ends, requests not sent yet fail with its error
// and those in flight are cancelled.
func (l *Loader) Run(ctx context.Context, reqs []Request, compression float64, done func()) []Outcome {
	out := make([]Outcome, len(reqs))
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for i, r := range reqs {
		due := time.Duration(float64(r.At) / compression)
		out[i] = Outcome{Line: r.Line, Scheduled: due}
		if wait := due - time.Since(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if err := ctx.Err(); err != nil {
			for j := i; j < len(reqs); j++ {
				out[j] = Outcome{Line: reqs[j].Line, Scheduled: time.Duration(float64(reqs[j].At) / compression), Err: err.Error()}
				done()
			}
			break
		}
		o := &out[i]
		wg.Go(func() {
			l.do(ctx, r, start, o)
			done()
		})
	}
	wg.Wait()
	return out
}

// chunk is the part of a streamed completion chunk we read.
type chunk struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// do sends r and reads its stream into o.
func (l *Loader) do(ctx context.Context, r Request, start time.Time, o *Outcome) {
	if l.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.Timeout)
		defer cancel()
	}
	body := l.body(r)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		o.Err = err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	// Names the request in kvgate's logs (msg=routed at debug level).
	req.Header.Set("X-Request-Id", "trace-line-"+strconv.Itoa(r.Line))
	sent := time.Now()
	o.Sent = sent.Sub(start)
	resp, err := l.Client.Do(req)
	if err != nil {
		o.Err = err.Error()
		return
	}
	defer resp.Body.Close()
	o.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.Err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return
	}
	if err := l.read(resp.Body, sent, o); err != nil {
		o.Err = err.Error()
		return
	}
	if o.PromptTokens != r.InputLength {
		o.Err = fmt.Sprintf("usage.prompt_tokens %d, sent %d", o.PromptTokens, r.InputLength)
	}
}

// read consumes a completion's event stream: TTFT at the first chunk with
// choices, E2E at [DONE], token counts from the usage chunk.
func (l *Loader) read(body io.Reader, sent time.Time, o *Outcome) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	gotUsage := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, other fields
		}
		data = bytes.TrimSpace(data)
		if bytes.Equal(data, []byte("[DONE]")) {
			o.E2E = time.Since(sent)
			if !gotUsage {
				return errors.New("stream without usage")
			}
			if o.TTFT == 0 {
				return errors.New("stream without content")
			}
			return nil
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("bad stream chunk %.200q: %w", data, err)
		}
		if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
			return fmt.Errorf("error in stream: %.300s", c.Error)
		}
		if len(c.Choices) > 0 && o.TTFT == 0 {
			o.TTFT = max(time.Since(sent), 1)
		}
		if c.Usage != nil {
			gotUsage = true
			o.PromptTokens, o.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				o.CachedTokens = d.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the stream: %w", err)
	}
	return errors.New("stream ended without [DONE]")
}

// body is r's request body: a streamed completion of its token prompt.
func (l *Loader) body(r Request) []byte {
	model, _ := json.Marshal(l.Model)
	b := make([]byte, 0, 64+len(model)+r.InputLength*6)
	b = append(b, `{"model":`...)
	b = append(b, model...)
	b = append(b, `,"prompt":`...)
	b = appendPromptJSON(b, r, l.TokensPerHash)
	b = fmt.Appendf(b, `,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, l.maxTokens(r))
	return b
}
