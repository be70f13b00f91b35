package jinja

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"
)

// goldenNow is the clock of the goldens' strftime_now (testdata/templates/gen.py in
// package tokenize writes them).
var goldenNow = time.Date(2024, 7, 23, 15, 4, 5, 0, time.UTC)

func fixedClock() time.Time { return goldenNow }

// renderRaw renders a template with the given JSON variables.
func renderRaw(src string, ctx []byte) (string, error) {
	t, err := Parse(src)
	if err != nil {
		return "", err
	}
	var vars Vars
	if len(ctx) > 0 {
		v, err := DecodeJSON(ctx)
		if err != nil {
			return "", err
		}
		for k, x := range v.Dict().All() {
			vars.Set(k.String(), x)
		}
	}
	return t.Render(&vars, Options{Now: fixedClock})
}

// TestJinjaConformance compares the interpreter with Python Jinja2 on small templates
// (printing, operators, scoping, macros, filters, tests, string methods, whitespace
// control and error messages).
func TestJinjaConformance(t *testing.T) {
	raw, err := os.ReadFile("testdata/jinja_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Context json.RawMessage `json:"context"`
		Cases   []struct {
			T         string  `json:"t"`
			Out       *string `json:"out"`
			Error     *string `json:"error"`
			ErrorType string  `json:"error_type"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	for _, c := range g.Cases {
		got, err := renderRaw(c.T, g.Context)
		if c.Error != nil {
			if err == nil {
				t.Errorf("%q: want %s %q, got %q", c.T, c.ErrorType, *c.Error, got)
				continue
			}
			msg := err.Error()
			var je *Error
			if errors.As(err, &je) {
				msg = je.Message
			}
			compileTime := c.ErrorType == "TemplateSyntaxError" || c.ErrorType == "TemplateAssertionError" || c.ErrorType == "SyntaxError"
			if !compileTime && msg != *c.Error {
				t.Errorf("%q: error\n got: %q\nwant: %q (%s)", c.T, msg, *c.Error, c.ErrorType)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: unexpected error %v", c.T, err)
			continue
		}
		if got != *c.Out {
			t.Errorf("%q:\n got: %q\nwant: %q", c.T, got, *c.Out)
		}
	}
}
