package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/fixture"
)

// needTokenizer returns the directory of a real tokenizer, skipping t when it
// is absent (see internal/fixture).
func needTokenizer(t *testing.T, family string) string {
	t.Helper()
	return fixture.Family(t, family)
}

// TestE2ETokenizeCLI drives `kvgate tokenize` with JSON lines, against ids
// Hugging Face tokenizers publishes for these models (see the README of the
// tokenizer directory, "Checks").
func TestE2ETokenizeCLI(t *testing.T) {
	dirs := fixture.Families(t, "qwen2.5", "llama2")
	qwen, llama2 := dirs[0], dirs[1]

	type line struct {
		IDs   []uint32 `json:"ids"`
		Error *string  `json:"error"`
	}
	tokenizeLines := func(t *testing.T, dir string, in string) []line {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), kvgateBin, "tokenize", "--tokenizer", dir)
		cmd.Stdin = strings.NewReader(in)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kvgate tokenize: %v; stderr %s", err, stderr.String())
		}
		var lines []line
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var x line
			if err := json.Unmarshal([]byte(l), &x); err != nil {
				t.Fatalf("output line %q: %v", l, err)
			}
			lines = append(lines, x)
		}
		return lines
	}

	qwenChat := "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	chatText, _ := json.Marshal(qwenChat)
	got := tokenizeLines(t, qwen, strings.Join([]string{
		`{"text": "<|im_start|>hello<|im_end|>"}`,
		`{"messages": [{"role": "user", "content": "hi"}]}`,
		`{"text": ` + string(chatText) + `, "add_special_tokens": false}`,
		``,
		`{"text": "unterminated`,
		`{"nothing": 1}`,
		`{"text": "x", "messages": [{"role": "user", "content": "hi"}]}`,
		`{"text": "after errors"}`,
	}, "\n"))
	if len(got) != 7 {
		t.Fatalf("%d output lines for 7 inputs (the blank line is skipped): %+v", len(got), got)
	}
	if want := []uint32{151644, 14990, 151645}; !slices.Equal(got[0].IDs, want) {
		t.Errorf("qwen text ids %v, want %v", got[0].IDs, want)
	}
	if len(got[1].IDs) == 0 || !slices.Equal(got[1].IDs, got[2].IDs) {
		t.Errorf("chat ids %v differ from the ids of the rendered template text %v", got[1].IDs, got[2].IDs)
	}
	for i, want := range map[int]string{3: "bad input line", 4: `want "text" or "messages"`, 5: "not both"} {
		if got[i].Error == nil || !strings.Contains(*got[i].Error, want) || got[i].IDs != nil {
			t.Errorf("line %d: %+v, want an error mentioning %q", i, got[i], want)
		}
	}
	if got[6].Error != nil || len(got[6].IDs) == 0 {
		t.Errorf("a good line after bad ones: %+v", got[6])
	}

	if got := tokenizeLines(t, llama2, `{"text": "Hello world"}`+"\n"+`{"text": "Hello world", "add_special_tokens": false}`); !slices.Equal(got[0].IDs, []uint32{1, 15043, 3186}) || !slices.Equal(got[1].IDs, []uint32{15043, 3186}) {
		t.Errorf("llama2 ids %+v, want [1 15043 3186] then [15043 3186]", got)
	}
}

func TestE2ETokenizeCLIErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no tokenizer flag", []string{"tokenize"}, "kvgate: tokenize: --tokenizer DIR is required"},
		{"missing directory", []string{"tokenize", "--tokenizer", filepath.Join(t.TempDir(), "none")}, "kvgate: tokenize: model \"cli\":"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), kvgateBin, tc.args...)
			cmd.Stdin = strings.NewReader(`{"text": "x"}`)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1", err)
			}
			if msg := stderr.String(); !strings.HasPrefix(msg, tc.want) || strings.Count(msg, "\n") != 1 || stdout.Len() != 0 {
				t.Fatalf("stderr %q stdout %q, want one line starting %q", msg, stdout.String(), tc.want)
			}
		})
	}
}
