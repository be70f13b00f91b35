package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Level is every policy's run at one load level.
type Level struct {
	Compression float64
	Load        float64 // Compression / Speedup
	Summaries   []Summary
}

// Report is a whole benchmark: its setup and its results.
type Report struct {
	Command string // how it was run
	Machine string
	// KvgateVersion is what `kvgate version` printed.
	KvgateVersion string
	Trace         string
	Start         time.Duration // window start in the trace
	Window        time.Duration // window length in trace time
	// Requests in the window, and their prompt and output sizes.
	Requests           int
	MeanInput, MeanOut float64
	MaxTokens          int
	TokensPerHash      int
	Oracle             Oracle
	Fleet              FleetConfig
	Policies           []string
	Levels             []Level
	Elapsed            time.Duration
	WindowDescription  string
}

// policyRow finds policy's summary in l.
func (l Level) policy(name string) (Summary, bool) {
	for _, s := range l.Summaries {
		if s.Policy == name {
			return s, true
		}
	}
	return Summary{}, false
}

// fmtDur formats a latency for a table: ms below a second, else seconds.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

// tableHeader are the columns of the results table.
var tableHeader = []string{"policy", "hit rate", "of oracle", "TTFT mean", "TTFT p50", "TTFT p99",
	"e2e mean", "e2e p50", "e2e p99", "output tok/s", "req/s", "completed"}

// Table renders a level as a Markdown table, columns padded for a
// terminal, with the oracle as the last row.
func (r *Report) Table(l Level) string {
	rows := [][]string{tableHeader}
	for _, s := range l.Summaries {
		name := policyLabel(s)
		done := fmt.Sprintf("%d/%d", s.Completed, s.Requests)
		if s.Errors > 0 {
			done += fmt.Sprintf(" (%d errors)", s.Errors)
		}
		rows = append(rows, []string{name, pct(s.HitRate), pct(ratio(s.HitRate, r.Oracle.TokenRate())),
			fmtDur(s.TTFTMean), fmtDur(s.TTFTP50), fmtDur(s.TTFTP99),
			fmtDur(s.E2EMean), fmtDur(s.E2EP50), fmtDur(s.E2EP99),
			fmt.Sprintf("%.0f", s.OutputTokensPerS), fmt.Sprintf("%.1f", s.RequestsPerS), done})
	}
	rows = append(rows, []string{"oracle (unbounded cache)", pct(r.Oracle.TokenRate()), "100%", "", "", "", "", "", "", "", "", ""})
	widths := make([]int, len(tableHeader))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	line := func(row []string) {
		b.WriteString("|")
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(&b, " %-*s |", widths[i], c)
			} else {
				fmt.Fprintf(&b, " %*s |", widths[i], c)
			}
		}
		b.WriteString("\n")
	}
	line(rows[0])
	b.WriteString("|")
	for i, w := range widths {
		if i == 0 {
			b.WriteString(" " + strings.Repeat("-", w) + " |")
		} else {
			b.WriteString(" " + strings.Repeat("-", w-1) + ": |")
		}
	}
	b.WriteString("\n")
	for _, row := range rows[1:] {
		line(row)
	}
	return b.String()
}

// policyLabel names a policy's run in tables and plot legends, marked
// "(!)" when the machine was contended during it.
func policyLabel(s Summary) string {
	if contended(s) != "" {
		return s.Policy + " (!)"
	}
	return s.Policy
}

// ttftCDFTitle is the title of a level's TTFT CDF plot. When some runs
// were contended (see contended), a second line says which: their curves
// show the machine as much as the policy.
func (r *Report) ttftCDFTitle(l Level) string {
	title := fmt.Sprintf("TTFT CDF: %s, %d requests, load %.2fx", r.Trace, r.Requests, l.Load)
	var busy []string
	for _, s := range l.Summaries {
		if contended(s) != "" {
			busy = append(busy, s.Policy)
		}
	}
	if len(busy) > 0 {
		title += fmt.Sprintf("\n(!) contended machine, latencies not reliable: %s", strings.Join(busy, ", "))
	}
	return title
}

// Verdict states how kv compares with the others at a level: mean TTFT
// ratios and its hit rate against the oracle. Empty without a kv run.
func (r *Report) Verdict(l Level) string {
	kv, ok := l.policy("kv")
	if !ok || kv.Completed == 0 {
		return ""
	}
	var parts []string
	for _, s := range l.Summaries {
		if s.Policy == "kv" || s.Completed == 0 || kv.TTFTMean <= 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.2fx", s.Policy, float64(s.TTFTMean)/float64(kv.TTFTMean)))
	}
	v := fmt.Sprintf("kv: hit rate %s of the oracle", pct(ratio(kv.HitRate, r.Oracle.TokenRate())))
	if len(parts) > 0 {
		v += "; mean TTFT of each policy / kv's: " + strings.Join(parts, ", ")
	}
	return v
}

// Setup describes the run in a few lines.
func (r *Report) Setup() string {
	var b strings.Builder
	f := r.Fleet
	fmt.Fprintf(&b, "trace %s, %s: %d requests (mean %.0f prompt tokens, %.0f output tokens%s), %d tokens per hash id\n",
		r.Trace, r.WindowDescription, r.Requests, r.MeanInput, r.MeanOut, capNote(r.MaxTokens), r.TokensPerHash)
	if r.KvgateVersion != "" {
		fmt.Fprintf(&b, "router: %s, every request through its proxy, one fresh kvgate and fleet per run\n", r.KvgateVersion)
	}
	if len(r.Fleet.ServeArgs) > 0 || len(r.Fleet.SimArgs) > 0 {
		fmt.Fprintf(&b, "extra arguments: kvgate serve %q, kvgate sim %q\n", r.Fleet.ServeArgs, r.Fleet.SimArgs)
	}
	fmt.Fprintf(&b, "fleet: kvgate sim, %d workers x %d DP ranks, %d blocks of %d tokens per rank, speedup %g (engine time runs %gx faster than real time)\n",
		f.Workers, f.DPSize, f.NumBlocks, f.BlockSize, f.Speedup, f.Speedup)
	fmt.Fprintf(&b, "oracle: %s of the prompt tokens are in blocks seen earlier in the window (%s of the blocks, unweighted); assumes one unbounded cache shared by all workers\n",
		pct(r.Oracle.TokenRate()), pct(r.Oracle.BlockRate()))
	b.WriteString("latencies are wall-clock through kvgate's proxy (multiply by the speedup for engine time); hit rate = cached / prompt tokens from usage\n")
	return b.String()
}

func capNote(maxTokens int) string {
	if maxTokens > 0 {
		return fmt.Sprintf(", capped at %d", maxTokens)
	}
	return ""
}

// levelTitle names a level.
func (r *Report) levelTitle(l Level) string {
	return fmt.Sprintf("time compression %gx, offered load %.2fx the trace's rate at engine speed (%.1f req/s sent)",
		l.Compression, l.Load, offered(l))
}

func offered(l Level) float64 {
	for _, s := range l.Summaries {
		if s.OfferedRequestsPS > 0 {
			return s.OfferedRequestsPS
		}
	}
	return 0
}

// WriteText writes the human-readable results (stdout).
func (r *Report) WriteText(w io.Writer, l Level) {
	fmt.Fprintf(w, "\n%s\n\n%s", r.levelTitle(l), r.Table(l))
	if v := r.Verdict(l); v != "" {
		fmt.Fprintf(w, "%s\n", v)
	}
	for _, s := range l.Summaries {
		fmt.Fprintf(w, "%s: %s; send lag p99 %s\n", s.Policy, s.Diag, fmtDur(s.LagP99))
	}
	for _, s := range l.Summaries {
		fmt.Fprintf(w, "%s: %s\n", s.Policy, s.Gap)
	}
	for _, s := range l.Summaries {
		if why := contended(s); why != "" {
			fmt.Fprintf(w, "(!) %s: %s: its latencies are not reliable, rerun on a quiet machine\n", s.Policy, why)
		}
	}
	for _, s := range l.Summaries {
		for _, e := range s.ErrorSamples {
			fmt.Fprintf(w, "%s error: %s\n", s.Policy, e)
		}
	}
}

// WriteMarkdown writes results.md.
func (r *Report) WriteMarkdown(w io.Writer, plots map[float64]string, sweepPlot string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Routing benchmark\n\nCommand: `%s`\n\nMachine: %s\n\n", r.Command, r.Machine)
	for _, line := range strings.Split(strings.TrimSpace(r.Setup()), "\n") {
		fmt.Fprintf(&b, "- %s\n", line)
	}
	fmt.Fprintf(&b, "- total time %.0f s\n", r.Elapsed.Seconds())
	for _, l := range r.Levels {
		fmt.Fprintf(&b, "\n## %s\n\n%s", r.levelTitle(l), r.Table(l))
		if v := r.Verdict(l); v != "" {
			fmt.Fprintf(&b, "\n%s\n", v)
		}
		b.WriteString("\n")
		for _, s := range l.Summaries {
			fmt.Fprintf(&b, "- %s: %s; send lag p99 %s\n", s.Policy, s.Diag, fmtDur(s.LagP99))
		}
		for _, s := range l.Summaries {
			fmt.Fprintf(&b, "- %s: %s\n", s.Policy, s.Gap)
		}
		for _, s := range l.Summaries {
			if why := contended(s); why != "" {
				fmt.Fprintf(&b, "- (!) %s: %s: its latencies are not reliable, rerun on a quiet machine\n", s.Policy, why)
			}
		}
		if p := plots[l.Compression]; p != "" {
			fmt.Fprintf(&b, "\n![TTFT CDF](%s)\n", p)
		}
	}
	if sweepPlot != "" {
		fmt.Fprintf(&b, "\n## Load sweep\n\n![mean TTFT against offered load](%s)\n", sweepPlot)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// csvHeader are the columns of results.csv, as doc.go describes them.
// decisionColumns follow them only when kvgate's decisions were logged
// (see Report.loggedDecisions).
var csvHeader = []string{"trace", "window_start_s", "window_s", "requests", "compression", "speedup", "load", "policy",
	"completed", "errors", "prompt_tokens", "cached_tokens", "hit_rate", "oracle_hit_rate", "hit_rate_of_oracle",
	"ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "e2e_mean_ms", "e2e_p50_ms", "e2e_p99_ms",
	"output_tokens", "duration_s", "output_tokens_per_s", "requests_per_s", "offered_requests_per_s", "send_lag_p99_ms",
	"requests_per_worker", "preemptions", "kvgate_cpu_s", "fleet_cpu_s", "runner_cpu_s", "other_cpu_s", "wall_s", "contended",
	"lost_in_flight_of_oracle"}

// decisionColumns are the results.csv columns read from kvgate's routed
// debug log, which it writes with -serve-args "--log-level debug" only:
// without it they could never be anything but 0.
var decisionColumns = []string{"lost_off_best_of_oracle", "decisions_off_best", "decisions_logged"}

// loggedDecisions reports whether any run read routing decisions from
// kvgate's log.
func (r *Report) loggedDecisions() bool {
	for _, l := range r.Levels {
		for _, s := range l.Summaries {
			if s.Gap.Decisions > 0 {
				return true
			}
		}
	}
	return false
}

// csvColumns are the columns of r's results.csv.
func (r *Report) csvColumns() []string {
	if r.loggedDecisions() {
		return slices.Concat(csvHeader, decisionColumns)
	}
	return csvHeader
}

// WriteCSV writes results.csv: a row per (level, policy) and an oracle row
// per level.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	header := r.csvColumns()
	_ = cw.Write(header)
	decisions := len(header) > len(csvHeader)
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }
	oracle := r.Oracle.TokenRate()
	for _, l := range r.Levels {
		common := []string{r.Trace, f(r.Start.Seconds()), f(r.Window.Seconds()), strconv.Itoa(r.Requests), f(l.Compression), f(r.Fleet.Speedup), f(l.Load)}
		for _, s := range l.Summaries {
			row := append(common[:len(common):len(common)], s.Policy,
				strconv.Itoa(s.Completed), strconv.Itoa(s.Errors), strconv.FormatInt(s.PromptTokens, 10), strconv.FormatInt(s.CachedTokens, 10),
				strconv.FormatFloat(s.HitRate, 'f', 5, 64), strconv.FormatFloat(oracle, 'f', 5, 64), strconv.FormatFloat(ratio(s.HitRate, oracle), 'f', 4, 64),
				ms(s.TTFTMean), ms(s.TTFTP50), ms(s.TTFTP90), ms(s.TTFTP99), ms(s.E2EMean), ms(s.E2EP50), ms(s.E2EP99),
				strconv.FormatInt(s.OutputTokens, 10), strconv.FormatFloat(s.Duration.Seconds(), 'f', 3, 64),
				strconv.FormatFloat(s.OutputTokensPerS, 'f', 1, 64), strconv.FormatFloat(s.RequestsPerS, 'f', 3, 64),
				strconv.FormatFloat(s.OfferedRequestsPS, 'f', 3, 64), ms(s.LagP99),
				routedList(s.Diag.Routed), strconv.FormatInt(s.Diag.Preemptions, 10), sec(s.Diag.KvgateCPU), sec(s.Diag.SimCPU),
				sec(s.Diag.RunnerCPU), sec(s.Diag.OtherCPU), sec(s.Diag.Wall), contended(s),
				share(s.Gap.InFlight, s.Gap.Oracle))
			if decisions {
				// A run without decisions in the log (a baseline policy)
				// has nothing to be off best of: empty, not 0.
				offBest, offBestTokens := "", ""
				if s.Gap.Decisions > 0 {
					offBest, offBestTokens = strconv.Itoa(s.Gap.OffBest), share(s.Gap.OffBestTokens, s.Gap.Oracle)
				}
				row = append(row, offBestTokens, offBest, strconv.Itoa(s.Gap.Decisions))
			}
			_ = cw.Write(row)
		}
		row := append(common[:len(common):len(common)], "oracle")
		for range len(header) - len(row) {
			row = append(row, "")
		}
		row[12], row[13], row[14] = strconv.FormatFloat(oracle, 'f', 5, 64), strconv.FormatFloat(oracle, 'f', 5, 64), "1"
		_ = cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

// share formats n/of for a CSV cell ("" when of is 0).
func share(n, of int64) string {
	if of == 0 {
		return ""
	}
	return strconv.FormatFloat(float64(n)/float64(of), 'f', 4, 64)
}

func sec(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) }

func routedList(r []int) string {
	s := make([]string, len(r))
	for i, n := range r {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, "/")
}

// requestsHeader are the columns of requests.csv.
var requestsHeader = []string{"compression", "policy", "trace_line", "scheduled_ms", "sent_ms", "ttft_ms", "e2e_ms",
	"prompt_tokens", "cached_tokens", "output_tokens", "status", "error"}

// requestsCSV streams per-request outcomes to a CSV file.
type requestsCSV struct {
	f  *os.File
	cw *csv.Writer
}

func createRequestsCSV(path string) (*requestsCSV, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	rc := &requestsCSV{f: f, cw: csv.NewWriter(f)}
	_ = rc.cw.Write(requestsHeader)
	return rc, nil
}

func (rc *requestsCSV) write(compression float64, policy string, outs []Outcome) {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }
	for _, o := range outs {
		_ = rc.cw.Write([]string{strconv.FormatFloat(compression, 'f', -1, 64), policy, strconv.Itoa(o.Line),
			ms(o.Scheduled), ms(o.Sent), ms(o.TTFT), ms(o.E2E),
			strconv.Itoa(o.PromptTokens), strconv.Itoa(o.CachedTokens), strconv.Itoa(o.OutputTokens), strconv.Itoa(o.Status), o.Err})
	}
}

func (rc *requestsCSV) close() error {
	rc.cw.Flush()
	err := rc.cw.Error()
	if cerr := rc.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeFile writes a file through fn.
func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return f.Close()
}
