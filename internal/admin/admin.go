// Package admin is the plumbing of kvgate's admin HTTP listener: routing
// with JSON 404/405 answers, the request body limit, the optional bearer
// token on mutating routes, per-route request metrics, and the JSON
// decoding and error helpers every handler uses (docs/http-api.md,
// "Errors and limits").
//
// It owns no API of its own: internal/httpapi defines the
// routes and hands them to a Server. It must not know about workers, indexes
// or any other domain type.
package admin

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxBody is the default limit on a request body: 8 MiB.
const DefaultMaxBody = 8 << 20

// Route is one admin endpoint.
type Route struct {
	// Pattern is a net/http pattern with a method: "POST /register".
	Pattern string
	Handler http.HandlerFunc
	// Mutates marks routes that change state; they require the bearer
	// token when one is configured.
	Mutates bool
}

// Options configure a Server. Zero values take the defaults.
type Options struct {
	// Token, when not empty, must be sent as "Authorization: Bearer <token>"
	// on every mutating route.
	Token string
	// MaxBody bounds request bodies, in bytes. Default DefaultMaxBody.
	MaxBody int64
	// Registerer receives the kvgate_http_* metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Server routes admin requests. Add routes with Handle before serving.
type Server struct {
	mux     *http.ServeMux
	opts    Options
	mutates map[string]bool // by pattern
	total   *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

// New returns a Server with no routes.
func New(opts Options) *Server {
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxBody
	}
	s := &Server{
		mux:     http.NewServeMux(),
		opts:    opts,
		mutates: make(map[string]bool),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_http_requests_total",
			Help: "Admin HTTP requests by route pattern (\"unmatched\" for none), method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_http_request_duration_seconds",
			Help:    "Admin HTTP request latency by route pattern, from headers read to handler return.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2.5, 14), // 50µs .. ~7.5s
		}, []string{"route"}),
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(s.total, s.latency)
	}
	return s
}

// Sibling returns a Server with no routes, s's options and s's request
// metrics: another listener of the same process (a service's own port)
// counts into the same kvgate_http_* series, by route pattern.
func (s *Server) Sibling() *Server {
	return &Server{mux: http.NewServeMux(), opts: s.opts, mutates: make(map[string]bool), total: s.total, latency: s.latency}
}

// Handle adds routes. It panics on a malformed or duplicate pattern, as
// http.ServeMux does.
func (s *Server) Handle(routes ...Route) {
	for _, rt := range routes {
		s.mux.Handle(rt.Pattern, rt.Handler)
		s.mutates[rt.Pattern] = rt.Mutates
	}
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	_, pattern := s.mux.Handler(r)
	route := pattern
	if route == "" {
		route = "unmatched"
	}
	defer func() {
		code := rec.status
		if code == 0 {
			code = http.StatusOK
		}
		s.total.WithLabelValues(route, methodLabel(r.Method), strconv.Itoa(code)).Inc()
		s.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	}()

	if pattern == "" {
		s.unmatched(rec, r)
		return
	}
	if s.mutates[pattern] && s.opts.Token != "" && !s.authorized(r) {
		rec.Header().Set("WWW-Authenticate", `Bearer realm="kvgate"`)
		WriteError(rec, Errorf(http.StatusUnauthorized, "missing or wrong bearer token (Authorization: Bearer <admin token>)"))
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(rec, r.Body, s.opts.MaxBody)
	}
	s.mux.ServeHTTP(rec, r)
}

// methodLabel bounds the method label: clients may send any token.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

func (s *Server) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(s.opts.Token)) == 1
}

// unmatched answers a request no route matched: 405 with the mux's Allow
// header when only the method is wrong, else 404.
func (s *Server) unmatched(w http.ResponseWriter, r *http.Request) {
	h, _ := s.mux.Handler(r)
	probe := &recorder{ResponseWriter: discard{header: http.Header{}}}
	h.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		allow := probe.Header().Get("Allow")
		w.Header().Set("Allow", allow)
		WriteError(w, Errorf(http.StatusMethodNotAllowed, "method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
		return
	}
	WriteError(w, Errorf(http.StatusNotFound, "not found: %s %s", r.Method, r.URL.Path))
}

// recorder remembers the status a handler sent.
type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// discard is a ResponseWriter that keeps headers and drops the body.
type discard struct{ header http.Header }

func (d discard) Header() http.Header         { return d.header }
func (d discard) Write(p []byte) (int, error) { return len(p), nil }
func (d discard) WriteHeader(int)             {}

// Error is an API error: an HTTP status and a concise description.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Errorf returns an *Error with status and a formatted message.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Msg: fmt.Sprintf(format, args...)}
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		_ = enc.Encode(map[string]string{"error": "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// WriteError writes err as {"error": "..."}: with its status for an
// *Error (anywhere in the chain), else as a 500.
func WriteError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Msg: err.Error()}
	}
	WriteJSON(w, e.Status, map[string]string{"error": e.Msg})
}

// OK writes the {"status": "ok"} answer of successful writes.
func OK(w http.ResponseWriter, status int) {
	WriteJSON(w, status, map[string]string{"status": "ok"})
}

// Decode reads r's body as one JSON value into v. Unknown fields are
// ignored. Numbers decode straight into v's integer fields (never through
// float64). It returns an *Error: 413 when the body exceeds the Server's
// limit, 400 when it is empty, malformed, has trailing data, or a field has
// the wrong type (naming the field).
func Decode(r *http.Request, v any) error {
	if r.Body == nil {
		return Errorf(http.StatusBadRequest, "request body is empty; want a JSON object")
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return Errorf(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", tooBig.Limit)
		}
		return Errorf(http.StatusBadRequest, "read request body: %v", err)
	}
	return DecodeBytes(data, v)
}

// DecodeBytes is Decode for a body already read.
func DecodeBytes(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return Errorf(http.StatusBadRequest, "request body is empty; want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Errorf(http.StatusBadRequest, "malformed JSON: unexpected data after the top-level value")
	}
	return nil
}

func decodeError(err error) *Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return Errorf(http.StatusBadRequest, "malformed JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &typ):
		if typ.Field == "" {
			return Errorf(http.StatusBadRequest, "request body must be %s, not %s", jsonKind(typ.Type.String()), typ.Value)
		}
		return Errorf(http.StatusBadRequest, "field %s: want %s, got %s", typ.Field, jsonKind(typ.Type.String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return Errorf(http.StatusBadRequest, "malformed JSON: unexpected end of body")
	}
	// Errors from a field's own UnmarshalJSON (hashes, ids) and the rest.
	return Errorf(http.StatusBadRequest, "invalid request body: %s", strings.TrimPrefix(err.Error(), "json: "))
}

// jsonKind describes a Go type in JSON terms for error messages.
func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["), strings.HasPrefix(goType, "struct"), strings.Contains(goType, "."):
		return "an object"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "uint"):
		return "a non-negative integer (" + goType + ")"
	case strings.HasPrefix(goType, "int"):
		return "an integer (" + goType + ")"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	}
	return goType
}
