package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type echoBody struct {
	Name  string   `json:"name"`
	Count uint32   `json:"count"`
	IDs   []uint64 `json:"ids"`
}

// testServer serves a read route, a mutating route that decodes and echoes
// its body, and a route with a path value.
func testServer(t *testing.T, opts Options) *httptest.Server {
	t.Helper()
	s := New(opts)
	s.Handle(
		Route{Pattern: "GET /health", Handler: func(w http.ResponseWriter, _ *http.Request) { OK(w, http.StatusOK) }},
		Route{Pattern: "POST /echo", Mutates: true, Handler: func(w http.ResponseWriter, r *http.Request) {
			var b echoBody
			if err := Decode(r, &b); err != nil {
				WriteError(w, err)
				return
			}
			WriteJSON(w, http.StatusCreated, b)
		}},
		Route{Pattern: "GET /things/{id}", Handler: func(w http.ResponseWriter, r *http.Request) {
			WriteJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id")})
		}},
	)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

func call(t *testing.T, method, url, auth, body string) (int, http.Header, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, strings.TrimSpace(string(b))
}

func TestServer(t *testing.T) {
	srv := testServer(t, Options{Token: "s3cret", MaxBody: 64})
	tests := []struct {
		name, method, path, auth, body string
		wantStatus                     int
		wantBody                       string // exact JSON; "" for a HEAD request
		wantAllow, wantAuthenticate    string
	}{
		{name: "read route", method: "GET", path: "/health", wantStatus: 200, wantBody: `{"status":"ok"}`},
		{name: "HEAD of a GET route", method: "HEAD", path: "/health", wantStatus: 200},
		{name: "path value", method: "GET", path: "/things/42", wantStatus: 200, wantBody: `{"id":"42"}`},
		{name: "wrong method", method: "POST", path: "/health", wantStatus: 405, wantAllow: "GET, HEAD",
			wantBody: `{"error":"method POST not allowed on /health (allowed: GET, HEAD)"}`},
		{name: "unknown route", method: "GET", path: "/nope", wantStatus: 404, wantBody: `{"error":"not found: GET /nope"}`},
		{name: "unknown sub-route", method: "GET", path: "/health/extra", wantStatus: 404, wantBody: `{"error":"not found: GET /health/extra"}`},
		{name: "no token", method: "POST", path: "/echo", body: `{}`, wantStatus: 401, wantAuthenticate: `Bearer realm="kvgate"`,
			wantBody: `{"error":"missing or wrong bearer token (Authorization: Bearer <admin token>)"}`},
		{name: "wrong token", method: "POST", path: "/echo", auth: "Bearer nope", body: `{}`, wantStatus: 401, wantAuthenticate: `Bearer realm="kvgate"`,
			wantBody: `{"error":"missing or wrong bearer token (Authorization: Bearer <admin token>)"}`},
		{name: "token of another scheme", method: "POST", path: "/echo", auth: "Basic s3cret", body: `{}`, wantStatus: 401, wantAuthenticate: `Bearer realm="kvgate"`,
			wantBody: `{"error":"missing or wrong bearer token (Authorization: Bearer <admin token>)"}`},
		{name: "right token, any case of the scheme", method: "POST", path: "/echo", auth: "bearer s3cret", body: `{"name":"a","extra":[1]}`,
			wantStatus: 201, wantBody: `{"name":"a","count":0,"ids":null}`},
		{name: "large integers stay exact", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"ids":[18446744073709551615,9007199254740993]}`,
			wantStatus: 201, wantBody: `{"name":"","count":0,"ids":[18446744073709551615,9007199254740993]}`},
		{name: "empty body", method: "POST", path: "/echo", auth: "Bearer s3cret", wantStatus: 400,
			wantBody: `{"error":"request body is empty; want a JSON object"}`},
		{name: "blank body", method: "POST", path: "/echo", auth: "Bearer s3cret", body: " \n", wantStatus: 400,
			wantBody: `{"error":"request body is empty; want a JSON object"}`},
		{name: "malformed", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"name":}`, wantStatus: 400,
			wantBody: `{"error":"malformed JSON at byte 9: invalid character '}' looking for beginning of value"}`},
		{name: "truncated", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"name":"a"`, wantStatus: 400,
			wantBody: `{"error":"malformed JSON: unexpected end of body"}`},
		{name: "trailing data", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{} {}`, wantStatus: 400,
			wantBody: `{"error":"malformed JSON: unexpected data after the top-level value"}`},
		{name: "array body", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `[1]`, wantStatus: 400,
			wantBody: `{"error":"request body must be an object, not array"}`},
		{name: "negative count", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"count":-1}`, wantStatus: 400,
			wantBody: `{"error":"field count: want a non-negative integer (uint32), got number -1"}`},
		{name: "count overflows", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"count":4294967296}`, wantStatus: 400,
			wantBody: `{"error":"field count: want a non-negative integer (uint32), got number 4294967296"}`},
		{name: "fractional id", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"ids":[1.5]}`, wantStatus: 400,
			wantBody: `{"error":"field ids: want a non-negative integer (uint64), got number 1.5"}`},
		{name: "string for a number", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"count":"3"}`, wantStatus: 400,
			wantBody: `{"error":"field count: want a non-negative integer (uint32), got string"}`},
		{name: "body over the limit", method: "POST", path: "/echo", auth: "Bearer s3cret", body: `{"name":"` + strings.Repeat("x", 64) + `"}`,
			wantStatus: 413, wantBody: `{"error":"request body exceeds 64 bytes"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := call(t, tc.method, srv.URL+tc.path, tc.auth, tc.body)
			if status != tc.wantStatus || body != tc.wantBody {
				t.Errorf("%s %s = %d %s, want %d %s", tc.method, tc.path, status, body, tc.wantStatus, tc.wantBody)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if got := hdr.Get("Allow"); got != tc.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tc.wantAllow)
			}
			if got := hdr.Get("WWW-Authenticate"); got != tc.wantAuthenticate {
				t.Errorf("WWW-Authenticate = %q, want %q", got, tc.wantAuthenticate)
			}
		})
	}
}

func TestNoTokenConfigured(t *testing.T) {
	srv := testServer(t, Options{})
	if status, _, body := call(t, "POST", srv.URL+"/echo", "", `{"name":"x"}`); status != 201 {
		t.Errorf("POST /echo without a configured token = %d %s, want 201", status, body)
	}
	// The default limit is 8 MiB: a 1 MiB body passes.
	big := `{"name":"` + strings.Repeat("x", 1<<20) + `"}`
	if status, _, body := call(t, "POST", srv.URL+"/echo", "", big); status != 201 {
		t.Errorf("1 MiB body = %d %.100s, want 201", status, body)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := testServer(t, Options{Registerer: reg, Token: "t"})
	call(t, "GET", srv.URL+"/health", "", "")
	call(t, "GET", srv.URL+"/health", "", "")
	call(t, "POST", srv.URL+"/echo", "", "{}")
	call(t, "GET", srv.URL+"/nope", "", "")
	call(t, "DELETE", srv.URL+"/things/1", "", "")
	call(t, "BREW", srv.URL+"/health", "", "")

	want := `
# HELP kvgate_http_requests_total Admin HTTP requests by route pattern ("unmatched" for none), method and status code.
# TYPE kvgate_http_requests_total counter
kvgate_http_requests_total{code="200",method="GET",route="GET /health"} 2
kvgate_http_requests_total{code="401",method="POST",route="POST /echo"} 1
kvgate_http_requests_total{code="404",method="GET",route="unmatched"} 1
kvgate_http_requests_total{code="405",method="DELETE",route="unmatched"} 1
kvgate_http_requests_total{code="405",method="other",route="unmatched"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvgate_http_requests_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "kvgate_http_request_duration_seconds"); n != 3 {
		t.Errorf("latency series = %d, want 3 (one per route label)", n)
	}
}

func TestWriteErrorPlainError(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, io.ErrUnexpectedEOF)
	var body map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &body); rec.Code != 500 || err != nil || body["error"] != "unexpected EOF" {
		t.Errorf("WriteError(plain) = %d %s", rec.Code, rec.Body)
	}
}

func TestSibling(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Options{Token: "tok", Registerer: reg})
	s.Handle(Route{Pattern: "GET /a", Handler: func(w http.ResponseWriter, _ *http.Request) { OK(w, http.StatusOK) }})
	sib := s.Sibling()
	sib.Handle(Route{Pattern: "POST /b", Mutates: true, Handler: func(w http.ResponseWriter, _ *http.Request) { OK(w, http.StatusOK) }})

	serve := func(h http.Handler, method, path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code
	}
	if got := serve(sib, "GET", "/a"); got != http.StatusNotFound {
		t.Errorf("sibling GET /a = %d, want 404 (routes are its own)", got)
	}
	if got := serve(sib, "POST", "/b"); got != http.StatusUnauthorized {
		t.Errorf("sibling POST /b without token = %d, want 401 (options shared)", got)
	}
	if got := serve(s, "POST", "/b"); got != http.StatusNotFound {
		t.Errorf("original POST /b = %d, want 404", got)
	}
	serve(s, "GET", "/a")
	if n := testutil.ToFloat64(s.total.WithLabelValues("unmatched", "GET", "404")); n != 1 {
		t.Errorf("unmatched GET 404 count = %v, want 1 (the sibling's, shared)", n)
	}
}
