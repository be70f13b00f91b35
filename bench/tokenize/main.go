// Command tokenize benchmarks kvgate's pure-Go tokenizer against the reference, the npm
// package `tokenizers` (Hugging Face's Rust core), on the same corpus, in one run:
//
//	go run ./bench/tokenize [-tokenizers DIR] [-mb 3] [-passes 5]
//
// For every <dir>/<family>/tokenizer.json (or tokenizer.json.gz) it encodes every
// document of the corpus with add_special_tokens=false on one goroutine (after a
// warm-up pass, as both sides have a word cache), runs the reference through a node
// child process (RAYON_NUM_THREADS=1, best of sequential encode() and encodeBatch()),
// checks that both produced identical ids for every document, and prints a Markdown
// table.
//
// -tokenizers defaults to $KVGATE_TOKENIZERS when set, else data/tokenizers (relative
// to the repository root, where go run ./bench/tokenize runs), which holds only
// qwen2.5 (see data/README.md). A run over every model family (Llama 2 and 3, Phi-2,
// Phi-3, Qwen2.5, Qwen3) needs the directory that holds them all, named by
// KVGATE_TOKENIZERS or given as -tokenizers $KVGATE_TOKENIZERS; the project's
// machines keep it beside the checkout, in the tokenizers folder of the shared
// directory (see CONTRIBUTING.md).
//
// The corpus ships with the command, embedded: testdata/corpus.txt.gz, about 0.87 MB
// of kvgate's own text (./gencorpus writes it and says what it holds): Markdown
// prose, the same rendered as HTML, Go sources, YAML and scripts, edge-case texts,
// and French, Japanese, Chinese and Korean paragraphs. Its sections are cut into
// documents of about -docsize bytes at line ends and interleaved in proportion, so
// that any prefix mixes them; -mb takes the documents in that order until it has
// that many bytes, cycling through the corpus again (the same documents) when -mb is
// larger than it.
//
// The reference is installed with npm into a cache directory outside the repository
// (-refdir, default $XDG_CACHE_HOME/kvgate/tokref) when missing; without node/npm the
// reference columns say so and only kvgate is measured.
package main

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
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
		dir     = flag.String("tokenizers", defaultTokenizers(), "directory of <family>/tokenizer.json or tokenizer.json.gz ($KVGATE_TOKENIZERS when set, else data/tokenizers)")
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

// defaultTokenizers is $KVGATE_TOKENIZERS, else the repository's data/tokenizers.
func defaultTokenizers() string {
	if d := os.Getenv("KVGATE_TOKENIZERS"); d != "" {
		return d
	}
	return filepath.Join("data", "tokenizers")
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
			ref, err := runReference(node, refDir, script, filepath.Join(dir, fam), docsFile, tmp, len(docs), passes)
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

// listFamilies returns the subdirectories of dir holding a tokenizer.json or a
// tokenizer.json.gz.
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
		if _, err := tokenize.TokenizerJSONPath(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, e.Name())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no <family>/tokenizer.json or tokenizer.json.gz under %s", dir)
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

// runReference runs ref.js on the tokenizer of famDir and reads back its ids. A
// gzipped tokenizer.json is decompressed into tmp for it.
func runReference(node, refDir, script, famDir, docsFile, tmp string, ndocs, passes int) (*refResult, error) {
	tokJSON, err := tokenize.TokenizerJSONPath(famDir)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(tokJSON, ".gz") {
		data, _, err := tokenize.ReadTokenizerJSON(famDir)
		if err != nil {
			return nil, err
		}
		tokJSON = filepath.Join(tmp, "tokenizer.json")
		if err := os.WriteFile(tokJSON, data, 0o644); err != nil {
			return nil, err
		}
	}
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

//go:embed testdata/corpus.txt.gz
var corpusGz []byte

// sectionMarker starts a line naming the corpus section that follows (./gencorpus).
const sectionMarker = "\x1ekvgate-corpus "

// section is one part of the corpus: a kind of text.
type section struct{ name, text string }

// readCorpus returns the sections of the embedded corpus.
func readCorpus() ([]section, error) {
	zr, err := gzip.NewReader(bytes.NewReader(corpusGz))
	if err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	parts := strings.Split(string(data), sectionMarker)
	if parts[0] != "" || len(parts) < 2 {
		return nil, errors.New("corpus: does not start with a section")
	}
	var out []section
	for _, p := range parts[1:] {
		name, text, ok := strings.Cut(p, "\n")
		if !ok || name == "" || text == "" {
			return nil, fmt.Errorf("corpus: bad section %.40q", p)
		}
		out = append(out, section{name, text})
	}
	return out, nil
}

// buildCorpus cuts the corpus's sections into documents of about docSize bytes,
// interleaves them in proportion (document j of a section of n comes at (j+0.5)/n
// of the way), and takes them in that order, cycling, until they hold size bytes.
// It returns the documents and a description of what they hold.
func buildCorpus(size, docSize int) ([]string, []string, error) {
	sections, err := readCorpus()
	if err != nil {
		return nil, nil, err
	}
	type doc struct {
		text    string
		section int
		at      float64
	}
	var all []doc
	corpusBytes := 0
	for i, s := range sections {
		parts := splitDocs(s.text, docSize)
		for j, p := range parts {
			all = append(all, doc{p, i, (float64(j) + 0.5) / float64(len(parts))})
		}
		corpusBytes += len(s.text)
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].at < all[b].at })
	var docs []string
	perSection := make([]int, len(sections))
	total := 0
	for i := 0; total < size; i++ {
		d := all[i%len(all)]
		docs = append(docs, d.text)
		perSection[d.section] += len(d.text)
		total += len(d.text)
	}
	var sources []string
	for i, s := range sections {
		sources = append(sources, fmt.Sprintf("%s %.2f MB", s.name, float64(perSection[i])/1e6))
	}
	if total > corpusBytes {
		sources = append(sources, fmt.Sprintf("the %.2f MB corpus cycled %.1f times", float64(corpusBytes)/1e6, float64(total)/float64(corpusBytes)))
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
