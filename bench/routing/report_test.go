package main

import (
	"bytes"
	"encoding/csv"
	"image/png"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func testReport() (*Report, Level) {
	ms := time.Millisecond
	l := Level{Compression: 40, Load: 4, Summaries: []Summary{
		{Policy: "kv", Requests: 3, Completed: 3, HitRate: 0.25, TTFTMean: 50 * ms, TTFTs: []time.Duration{10 * ms, 50 * ms, 90 * ms},
			Diag: Diagnostics{Routed: []int{1, 2}}},
		{Policy: "round-robin", Requests: 3, Completed: 2, Errors: 1, ErrorSamples: []string{"status 502"}, HitRate: 0.1,
			TTFTMean: 200 * ms, TTFTs: []time.Duration{100 * ms, 300 * ms}, LagP99: 150 * ms},
	}}
	r := &Report{Command: "routing -x", Machine: "test box", Trace: "t.jsonl", Requests: 3, TokensPerHash: 512,
		Oracle: Oracle{Blocks: 10, SeenBlocks: 3, Tokens: 100, SeenTokens: 30}, Fleet: FleetConfig{Workers: 2, DPSize: 1, Speedup: 10},
		Policies: []string{"kv", "round-robin"}, Levels: []Level{l}}
	return r, l
}

func TestReportText(t *testing.T) {
	r, l := testReport()
	var b bytes.Buffer
	r.WriteText(&b, l)
	out := b.String()
	for _, want := range []string{
		"| kv ", "25.0%", "83.3%", // hit rate and its share of the 30% oracle
		"| round-robin (!) ", "2/3 (1 errors)", "(!) round-robin: the runner sent requests late (p99 150.0 ms)",
		"| oracle (unbounded cache) |    30.0% |", "round-robin 4.00x", "round-robin error: status 502",
		"kv: requests per worker 1/2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	// Every table line has the same width.
	var widths []int
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "|") {
			widths = append(widths, len(line))
		}
	}
	if len(widths) != 5 {
		t.Fatalf("%d table lines, want 5", len(widths))
	}
	for _, w := range widths {
		if w != widths[0] {
			t.Errorf("table widths %v", widths)
			break
		}
	}
}

func TestReportFiles(t *testing.T) {
	r, l := testReport()
	dir := t.TempDir()
	path := filepath.Join(dir, "results.csv")
	if err := writeFile(path, r.WriteCSV); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	rows, err := csv.NewReader(f).ReadAll()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || rows[1][7] != "kv" || rows[2][7] != "round-robin" || rows[3][7] != "oracle" || rows[3][12] != "0.30000" {
		t.Errorf("rows %q", rows)
	}
	for _, row := range rows {
		if len(row) != len(csvHeader) {
			t.Errorf("row of %d columns, want %d", len(row), len(csvHeader))
		}
	}
	var md bytes.Buffer
	if err := r.WriteMarkdown(&md, map[float64]string{40: "ttft_cdf.png"}, "sweep.png"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Command: `routing -x`", "Machine: test box", "![TTFT CDF](ttft_cdf.png)", "![mean TTFT against offered load](sweep.png)", "| kv "} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	for name, plot := range map[string]func(string) error{
		"cdf.png": func(p string) error { return PlotTTFTCDF(p, "cdf", l) },
		"sweep.png": func(p string) error {
			return PlotSweep(p, "sweep", []Level{l, {Load: 8, Summaries: l.Summaries}}, r.Policies)
		},
	} {
		p := filepath.Join(dir, name)
		if err := plot(p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		f, _ := os.Open(p)
		_, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := PlotTTFTCDF(filepath.Join(dir, "none.png"), "x", Level{Summaries: []Summary{{Policy: "kv"}}}); err == nil {
		t.Error("CDF without a completed request: no error")
	}
}

func TestFmtDur(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{{0, "-"}, {1234 * time.Microsecond, "1.23 ms"}, {56789 * time.Microsecond, "56.8 ms"}, {2500 * time.Millisecond, "2.50 s"}} {
		if got := fmtDur(tc.d); got != tc.want {
			t.Errorf("fmtDur(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestProgress(t *testing.T) {
	var plain bytes.Buffer
	p := StartProgress(&plain, false, "kv", 4, time.Millisecond)
	p.Done()
	p.Done()
	p.Finish("ok")
	if got := plain.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "kv 2/4 requests in") || !strings.HasSuffix(got, "ok\n") {
		t.Errorf("non-terminal output %q", got)
	}
	var tty bytes.Buffer
	p = StartProgress(&tty, true, "rr", 2, time.Hour)
	p.Done()
	p.Done()
	p.Finish("done")
	if got := tty.String(); !strings.HasPrefix(got, "\r") || !strings.Contains(got, "[##############################] 2/2 requests") || !strings.HasSuffix(got, "done\x1b[K\n") {
		t.Errorf("terminal output %q", got)
	}
}

func TestLogTicks(t *testing.T) {
	var labels []string
	for _, tk := range (logTicks{}).Ticks(15, 1200) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got := strings.Join(labels, " "); got != "20 50 100 200 500 1000" {
		t.Errorf("labels %q", got)
	}
	if got := (logTicks{}).Ticks(3.5, 3.6); len(got) != 1 || got[0].Label == "" {
		t.Errorf("narrow range ticks %+v", got)
	}
}

func TestContended(t *testing.T) {
	cpus := time.Duration(runtime.NumCPU())
	tests := []struct {
		name string
		s    Summary
		want string
	}{
		{"quiet", Summary{Diag: Diagnostics{Wall: 10 * time.Second, OtherCPU: cpus * 500 * time.Millisecond}, LagP99: 5 * time.Millisecond}, ""},
		{"busy machine", Summary{Diag: Diagnostics{Wall: 10 * time.Second, OtherCPU: cpus * 5 * time.Second}}, "other processes used 50% of the machine's CPU"},
		{"late runner", Summary{LagP99: 2 * time.Second}, "the runner sent requests late (p99 2.00 s)"},
		{"no measurement", Summary{}, ""},
	}
	for _, tc := range tests {
		if got := contended(tc.s); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestCSVDecisionColumns: the columns read from kvgate's routed debug log
// are in results.csv only when some run logged decisions; there, a run
// without decisions (a baseline) has empty cells, not zeros.
func TestCSVDecisionColumns(t *testing.T) {
	read := func(r *Report) [][]string {
		t.Helper()
		var b bytes.Buffer
		if err := r.WriteCSV(&b); err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(&b).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	r, _ := testReport()
	rows := read(r)
	if got := strings.Join(rows[0], ","); strings.Contains(got, "decisions") || strings.Contains(got, "off_best") {
		t.Errorf("no decision logged, header %s", got)
	}
	r.Levels[0].Summaries[0].Gap = ReuseGap{Oracle: 1000, Found: 500, InFlight: 100, OffBestTokens: 200, Other: 200, Decisions: 3, OffBest: 1}
	rows = read(r)
	if got, want := rows[0][len(rows[0])-3:], decisionColumns; !slices.Equal(got, want) {
		t.Errorf("header ends %q, want %q", got, want)
	}
	n := len(rows[0])
	if kv := rows[1][n-4:]; !slices.Equal(kv, []string{"0.1000", "0.2000", "1", "3"}) {
		t.Errorf("kv gap cells %q", kv)
	}
	if rr := rows[2][n-3:]; !slices.Equal(rr, []string{"", "", "0"}) {
		t.Errorf("round-robin decision cells %q, want empty, empty, 0", rr)
	}
	for _, row := range rows {
		if len(row) != n {
			t.Errorf("row of %d columns, want %d", len(row), n)
		}
	}
}

// TestTTFTCDFLabels: a contended run is named in the TTFT CDF's title
// and marked in its legend, as in the table.
func TestTTFTCDFLabels(t *testing.T) {
	r, l := testReport() // round-robin's runner sent requests late
	if got, want := r.ttftCDFTitle(l), "TTFT CDF: t.jsonl, 3 requests, load 4.00x\n(!) contended machine, latencies not reliable: round-robin"; got != want {
		t.Errorf("title %q, want %q", got, want)
	}
	if got := policyLabel(l.Summaries[1]); got != "round-robin (!)" {
		t.Errorf("legend %q", got)
	}
	if got := policyLabel(l.Summaries[0]); got != "kv" {
		t.Errorf("legend %q", got)
	}
	quiet := Level{Load: 4, Summaries: l.Summaries[:1]}
	if got, want := r.ttftCDFTitle(quiet), "TTFT CDF: t.jsonl, 3 requests, load 4.00x"; got != want {
		t.Errorf("quiet title %q, want %q", got, want)
	}
	if err := PlotTTFTCDF(filepath.Join(t.TempDir(), "cdf.png"), r.ttftCDFTitle(l), l); err != nil {
		t.Fatal(err)
	}
}
