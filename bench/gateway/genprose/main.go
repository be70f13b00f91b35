// Genprose writes bench/gateway/testdata/prose.txt.gz, the text bench/gateway builds its
// prompts from: the English prose of kvgate's own README.md, deploy/README.md
// and BENCHMARKS.md (paragraphs and list items; no code, tables or headings),
// with Markdown's inline markup removed. Being kvgate's own text, it carries
// no third-party license. Run it from the repository root:
//
//	go run ./bench/gateway/genprose
package main

import (
	"bytes"
	"compress/gzip"
	"log"
	"os"
	"regexp"
	"strings"
)

var (
	link   = regexp.MustCompile(`\[([^\]]+)\]\([^)]+\)`)
	markup = regexp.MustCompile("[`*]")
)

func main() {
	var out strings.Builder
	for _, f := range []string{"README.md", "deploy/README.md", "BENCHMARKS.md"} {
		data, err := os.ReadFile(f)
		if err != nil {
			log.Fatal(err)
		}
		fenced := false
		var para []string
		flush := func() {
			if len(para) > 0 {
				out.WriteString(strings.Join(para, " "))
				out.WriteString("\n\n")
				para = nil
			}
		}
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "```") {
				fenced = !fenced
				flush()
				continue
			}
			switch {
			case fenced, strings.HasPrefix(l, "    "), strings.HasPrefix(l, "\t"), strings.HasPrefix(l, "|"), strings.HasPrefix(l, "#"):
				flush()
			case strings.TrimSpace(l) == "":
				flush()
			default:
				l = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(l), "- "), "* ")
				para = append(para, markup.ReplaceAllString(link.ReplaceAllString(l, "$1"), ""))
			}
		}
		flush()
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	zw.Write([]byte(out.String()))
	if err := zw.Close(); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("bench/gateway/testdata/prose.txt.gz", gz.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("bench/gateway/testdata/prose.txt.gz: %d words, %d bytes, %d gzipped", len(strings.Fields(out.String())), out.Len(), gz.Len())
}
