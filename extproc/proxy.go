package extproc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	// Transport sends requests to workers; default a transport with
	// keep-alive connections and no response timeout (streams are long).
	Transport http.RoundTripper
	// MaxBody is the largest request body accepted (413 beyond); default
	// 32 MiB.
	MaxBody int64
	Logger  *slog.Logger
}

// Proxy is the embedded OpenAI-compatible reverse proxy: it makes the
// ext_proc server's decision in process, forwards the request to the
// chosen worker (the next best ones if it cannot be reached) and streams
// the response back, with the same lifecycle accounting, naming the worker
// that answered in WorkerIDHeader and DPRankHeader.
type Proxy struct {
	g    *Gateway
	rt   http.RoundTripper
	opts ProxyOptions
	log  *slog.Logger
}

// NewProxy returns a proxy over g.
func NewProxy(g *Gateway, opts ProxyOptions) *Proxy {
	if opts.MaxBody <= 0 {
		opts.MaxBody = defaultMaxBody
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	rt := opts.Transport
	if rt == nil {
		rt = &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			DisableCompression:    true, // pass the client's Accept-Encoding and the worker's encoding through
			ExpectContinueTimeout: time.Second,
		}
	}
	return &Proxy{g: g, rt: rt, opts: opts, log: opts.Logger}
}

// hopHeaders are not forwarded (RFC 9110 section 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	end := "cancelled"
	defer func() { p.g.m.streams.WithLabelValues("proxy", end).Inc() }()
	refuse := func(e *Error) {
		end = "refused"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.Status)
		_, _ = w.Write(e.Body())
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.opts.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			refuse(errorf(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", p.opts.MaxBody))
		} else {
			refuse(errorf(http.StatusBadRequest, "reading the request body: %v", err))
		}
		return
	}
	var prompt *Prompt
	if len(body) > 0 {
		pp, e := ParsePrompt(r.URL.Path, body)
		if e != nil {
			refuse(e)
			return
		}
		prompt = &pp
	}
	route, e := p.g.Decide(r.Context(), prompt, nil, r.Header.Get(RequestIDHeader))
	if e != nil {
		refuse(e)
		return
	}
	defer route.Finish()

	resp, served, err := p.forward(r, body, route)
	if err != nil {
		if r.Context().Err() == nil {
			end = "error"
			refuse(errorf(http.StatusBadGateway, "no worker reachable: %v", err))
		}
		return
	}
	defer resp.Body.Close()
	for _, h := range hopHeaders {
		resp.Header.Del(h)
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.Header().Set(RequestIDHeader, route.ID)
	for _, h := range served.servedHeaders() {
		w.Header().Set(h[0], h[1])
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	scan := usageScanner{sse: strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")}
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			route.PrefillDone()
			scan.write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client left
			}
			_ = rc.Flush()
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			if r.Context().Err() == nil {
				end = "error"
				p.log.Warn("proxy: response from worker broke off", "id", route.ID, "endpoint", route.Endpoint, "err", rerr)
			}
			return
		}
	}
	if u := scan.result(); u != nil && resp.StatusCode < 400 {
		route.Usage(*u)
	}
	end = "completed"
}

// forward sends the request to the route's endpoint, then to each fallback
// while the previous one could not be reached at all, and returns the
// response with the worker rank that answered.
func (p *Proxy) forward(r *http.Request, body []byte, route *Route) (*http.Response, pick, error) {
	var errs []error
	for _, to := range route.picks() {
		ep := to.endpoint
		out, err := p.outgoing(r.Context(), r, body, to, route)
		if err != nil {
			return nil, pick{}, err
		}
		resp, err := p.rt.RoundTrip(out)
		if err == nil {
			return resp, to, nil
		}
		errs = append(errs, err)
		if r.Context().Err() != nil || !unreachable(err) {
			break
		}
		p.log.Info("proxy: worker unreachable, trying the next", "id", route.ID, "endpoint", ep, "err", err)
	}
	return nil, pick{}, errors.Join(errs...)
}

// unreachable reports whether err means the request never reached the
// worker (so sending it elsewhere is safe).
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// outgoing is the request to the worker rank to: the client's, without
// hop-by-hop headers, with the request id and the rank the worker must
// serve it on (when it has several).
func (p *Proxy) outgoing(ctx context.Context, r *http.Request, body []byte, to pick, route *Route) (*http.Request, error) {
	out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+to.endpoint+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Del(DestinationHeader)
	out.Header.Set(RequestIDHeader, route.ID)
	if to.setRank {
		out.Header.Set(RankHeader, strconv.FormatUint(uint64(to.rank), 10))
	} else {
		out.Header.Del(RankHeader)
	}
	out.ContentLength = int64(len(body))
	return out, nil
}
