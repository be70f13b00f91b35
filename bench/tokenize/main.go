// Command tokenize benchmarks kvgate's pure-Go tokenizer against the reference, the npm
// package `tokenizers` (Hugging Face's Rust core), on the same corpus, in one run:
//
//	go run ./bench/tokenize [-tokenizers ../shared/tokenizers] [-mb 3] [-passes 5]
//
// For every <dir>/*/tokenizer.json it encodes every document of the corpus with
// add_special_tokens=false on one goroutine (after a warm-up pass, as both sides have a
// word cache), runs the reference through a node child process (RAYON_NUM_THREADS=1,
// best of sequential encode() and encodeBatch()), checks that both produced identical
// ids for every document, and prints a Markdown table.
//
// The corpus is built from text on the machine: the Go specification and Go standard
// library sources from GOROOT (English prose, HTML, code) and the UTF-8 test texts of
// golang.org/x/text from the module cache (French, Japanese, Chinese, Korean), cut
// into documents of about -docsize bytes at line ends.
//
// The reference is installed with npm into a cache directory outside the repository
// (-refdir, default $XDG_CACHE_HOME/kvgate/tokref) when missing; without node/npm the
// reference columns say so and only kvgate is measured.
package main

import (
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvgate/kvgate/tokenize"
)

//go:embed ref.js
var refJS []byte

const refPackage = "tokenizers@0.23.2"

func main() {
	var (
		dir     = flag.String("tokenizers", "../shared/tokenizers", "directory of <family>/tokenizer.json")
		mb      = flag.Float64("mb", 3, "corpus size in MB")
		docSize = flag.Int("docsize", 4096, "document size in bytes")
		passes  = flag.Int("passes", 5, "timed passes per side (best is reported)")
		only    = flag.String("only", "", "comma-separated families (default: all)")
		refDir  = flag.String("refdir", defaultRefDir(), "npm install directory of the reference")
	)
	flag.Parse()
	if err := run(os.Stdout, *dir, *mb, *docSize, *passes, *only, *refDir); err != nil {
		fmt.Fprintln(os.Stderr, "bench/tokenize:", err)
		os.Exit(1)
	}
}

func defaultRefDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kvgate", "tokref")
	}
	return filepath.Join(os.TempDir(), "kvgate-tokref")
}

// result is one tokenizer's row.
type result struct {
	name                  string
	load                  time.Duration
	goBest                time.Duration
	tokens                int
	ref                   *refResult // nil: reference not run
	refNote               string     // why not, or a mismatch
	mismatchDocs, numDocs int
}

type refResult struct {
	LoadMs  float64   `json:"load_ms"`
	SeqMs   []float64 `json:"seq_ms"`
	BatchMs []float64 `json:"batch_ms"`
	Tokens  int       `json:"tokens"`
	ids     [][]uint32
}

func (r *refResult) best() time.Duration {
	best := slices.Min(append(slices.Clone(r.SeqMs), r.BatchMs...))
	return time.Duration(best * float64(time.Millisecond))
}

func run(w io.Writer, dir string, mb float64, docSize, passes int, only, refDir string) error {
	families, err := listFamilies(dir, only)
	if err != nil {
		return err
	}
	docs, sources, err := buildCorpus(int(mb*1e6), docSize)
	if err != nil {
		return err
	}
	corpusBytes := 0
	for _, d := range docs {
		corpusBytes += len(d)
	}
	fmt.Fprintf(w, "corpus: %d documents, %.2f MB (%s)\n", len(docs), float64(corpusBytes)/1e6, strings.Join(sources, ", "))

	node, refErr := ensureReference(refDir)
	if refErr != nil {
		fmt.Fprintf(w, "reference not run: %v\n", refErr)
	}
	tmp, err := os.MkdirTemp("", "kvgate-bench-tokenize")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	docsFile := filepath.Join(tmp, "docs.json")
	if err := writeJSON(docsFile, docs); err != nil {
		return err
	}
	script := filepath.Join(tmp, "ref.js")
	if err := os.WriteFile(script, refJS, 0o644); err != nil {
		return err
	}

	var rows []result
	for _, fam := range families {
		res := result{name: fam, numDocs: len(docs)}
		runtime.GC() // the previous tokenizer's tables are garbage now
		t0 := time.Now()
		tk, err := tokenize.Load(filepath.Join(dir, fam))
		res.load = time.Since(t0)
		if err != nil {
			var ue *tokenize.UnsupportedError
			if errors.As(err, &ue) {
				fmt.Fprintf(w, "%s: unsupported by kvgate: %v\n", fam, err)
				continue
			}
			return err
		}
		goIDs, best, tokens, err := encodeAll(tk, docs, passes)
		if err != nil {
			return fmt.Errorf("%s: %w", fam, err)
		}
		res.goBest, res.tokens = best, tokens
		if refErr != nil {
			res.refNote = "not run"
		} else {
			ref, err := runReference(node, refDir, script, filepath.Join(dir, fam, "tokenizer.json"), docsFile, tmp, len(docs), passes)
			if err != nil {
				res.refNote = "failed: " + err.Error()
			} else {
				res.ref = ref
				for i := range docs {
					if !slices.Equal(goIDs[i], ref.ids[i]) {
						res.mismatchDocs++
					}
				}
			}
		}
		rows = append(rows, res)
	}
	printTable(w, rows, corpusBytes)
	for _, r := range rows {
		if r.mismatchDocs > 0 {
			return fmt.Errorf("%s: ids differ from the reference in %d of %d documents", r.name, r.mismatchDocs, r.numDocs)
		}
	}
	return nil
}

// listFamilies returns the subdirectories of dir holding a tokenizer.json.
func listFamilies(dir, only string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var want map[string]bool
	if only != "" {
		want = map[string]bool{}
		for _, f := range strings.Split(only, ",") {
			want[strings.TrimSpace(f)] = true
		}
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() || (want != nil && !want[e.Name()]) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "tokenizer.json")); err == nil {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no <family>/tokenizer.json under %s", dir)
	}
	return out, nil
}

// encodeAll encodes every document once (warm-up, keeping the ids), then passes more
// times, returning the best pass.
func encodeAll(tk *tokenize.Tokenizer, docs []string, passes int) ([][]uint32, time.Duration, int, error) {
	ids := make([][]uint32, len(docs))
	tokens := 0
	for i, d := range docs {
		var err error
		if ids[i], err = tk.Encode(d, false); err != nil {
			return nil, 0, 0, err
		}
		tokens += len(ids[i])
	}
	var buf []uint32
	best := time.Duration(1<<63 - 1)
	runtime.GC()
	for p := 0; p < passes; p++ {
		t0 := time.Now()
		for _, d := range docs {
			var err error
			if buf, err = tk.AppendEncode(buf[:0], d, false); err != nil {
				return nil, 0, 0, err
			}
		}
		best = min(best, time.Since(t0))
	}
	return ids, best, tokens, nil
}

// ensureReference finds node and installs the npm reference into refDir if missing.
func ensureReference(refDir string) (string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return "", fmt.Errorf("node is not installed (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(refDir, "node_modules", "tokenizers", "package.json")); err == nil {
		return node, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("npm is not installed (%v), and %s has no tokenizers package", err, refDir)
	}
	if err := os.MkdirAll(refDir, 0o755); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "installing %s into %s\n", refPackage, refDir)
	cmd := exec.Command(npm, "install", "--prefix", refDir, "--no-audit", "--no-fund", refPackage)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("npm install %s: %w", refPackage, err)
	}
	return node, nil
}

// runReference runs ref.js on one tokenizer and reads back its ids.
func runReference(node, refDir, script, tokJSON, docsFile, tmp string, ndocs, passes int) (*refResult, error) {
	idsFile := filepath.Join(tmp, "ref-ids.bin")
	cmd := exec.Command(node, script, tokJSON, docsFile, idsFile, fmt.Sprint(passes))
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(refDir, "node_modules"), "RAYON_NUM_THREADS=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var r refResult
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("ref.js output %q: %w", out, err)
	}
	data, err := os.ReadFile(idsFile)
	if err != nil {
		return nil, err
	}
	for off := 0; off < len(data); {
		if off+4 > len(data) {
			return nil, errors.New("truncated ids file")
		}
		n := int(binary.LittleEndian.Uint32(data[off:]))
		off += 4
		if off+4*n > len(data) {
			return nil, errors.New("truncated ids file")
		}
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = binary.LittleEndian.Uint32(data[off+4*i:])
		}
		off += 4 * n
		r.ids = append(r.ids, ids)
	}
	if len(r.ids) != ndocs {
		return nil, fmt.Errorf("reference returned %d documents, want %d", len(r.ids), ndocs)
	}
	return &r, nil
}

func printTable(w io.Writer, rows []result, corpusBytes int) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| tokenizer | kvgate MB/s | kvgate Mtok/s | reference MB/s | reference Mtok/s | speed ratio | kvgate load | reference load | ids identical |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|")
	mbps := func(d time.Duration) float64 { return float64(corpusBytes) / 1e6 / d.Seconds() }
	mtps := func(tokens int, d time.Duration) float64 { return float64(tokens) / 1e6 / d.Seconds() }
	for _, r := range rows {
		refMB, refTok, ratio, refLoad, same := "n/a", "n/a", "n/a", "n/a", r.refNote
		if r.ref != nil {
			rb := r.ref.best()
			refMB = fmt.Sprintf("%.2f", mbps(rb))
			refTok = fmt.Sprintf("%.3f", mtps(r.ref.Tokens, rb))
			ratio = fmt.Sprintf("%.1fx", rb.Seconds()/r.goBest.Seconds())
			refLoad = fmt.Sprintf("%.0f ms", r.ref.LoadMs)
			if r.mismatchDocs == 0 {
				same = fmt.Sprintf("yes (%d docs, %d tokens)", r.numDocs, r.tokens)
			} else {
				same = fmt.Sprintf("NO: %d of %d docs differ", r.mismatchDocs, r.numDocs)
			}
		}
		fmt.Fprintf(w, "| %s | %.2f | %.3f | %s | %s | %s | %.0f ms | %s | %s |\n",
			r.name, mbps(r.goBest), mtps(r.tokens, r.goBest), refMB, refTok, ratio,
			float64(r.load.Microseconds())/1000, refLoad, same)
	}
}

func writeJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// buildCorpus gathers about size bytes of text and cuts it into documents.
func buildCorpus(size, docSize int) ([]string, []string, error) {
	goroot, err := goEnv("GOROOT")
	if err != nil {
		return nil, nil, err
	}
	var texts []string
	var sources []string
	total := 0
	add := func(name string, data []byte) {
		texts = append(texts, string(data))
		total += len(data)
		_ = name
	}
	// Multilingual text: golang.org/x/text's UTF-8 test texts (about 120 kB), twice.
	if dir, err := moduleDir("golang.org/x/text"); err == nil {
		files, _ := filepath.Glob(filepath.Join(dir, "encoding", "testdata", "*-utf-8.txt"))
		sort.Strings(files)
		n := 0
		for rep := 0; rep < 2; rep++ {
			for _, f := range files {
				if data, err := os.ReadFile(f); err == nil {
					add(f, data)
					n += len(data)
				}
			}
		}
		if n > 0 {
			sources = append(sources, fmt.Sprintf("x/text testdata %.2f MB", float64(n)/1e6))
		}
	}
	// The Go specification (HTML prose).
	if data, err := os.ReadFile(filepath.Join(goroot, "doc", "go_spec.html")); err == nil {
		add("go_spec.html", data)
		sources = append(sources, fmt.Sprintf("go_spec.html %.2f MB", float64(len(data))/1e6))
	}
	// Go sources, in a fixed order, up to the size.
	var goFiles []string
	err = filepath.WalkDir(filepath.Join(goroot, "src"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			goFiles = append(goFiles, path)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(goFiles)
	codeBytes := 0
	for _, f := range goFiles {
		if total >= size {
			break
		}
		data, err := os.ReadFile(f)
		if err != nil || !isText(data) {
			continue
		}
		add(f, data)
		codeBytes += len(data)
	}
	sources = append(sources, fmt.Sprintf("GOROOT/src Go files %.2f MB", float64(codeBytes)/1e6))
	var docs []string
	for _, t := range texts {
		docs = append(docs, splitDocs(t, docSize)...)
	}
	return docs, sources, nil
}

// splitDocs cuts s at line ends into pieces of about size bytes.
func splitDocs(s string, size int) []string {
	var out []string
	for len(s) > 0 {
		if len(s) <= size {
			out = append(out, s)
			break
		}
		cut := strings.LastIndexByte(s[:size], '\n') + 1
		if cut <= size/2 {
			cut = size
			for cut < len(s) && s[cut]&0xC0 == 0x80 { // keep UTF-8 sequences whole
				cut++
			}
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return out
}

func isText(b []byte) bool {
	return !slices.Contains(b, 0)
}

func goEnv(key string) (string, error) {
	out, err := exec.Command("go", "env", key).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", key, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func moduleDir(path string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path).Output()
	if err != nil {
		return "", err
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("module %s not downloaded", path)
	}
	return dir, nil
}
