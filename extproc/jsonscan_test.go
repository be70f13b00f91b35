package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// checkScan compares scanObject with encoding/json on doc: the same
// verdict, and the same members (last occurrence of a key winning).
func checkScan(t *testing.T, doc []byte) {
	t.Helper()
	got := map[string][]byte{}
	err := scanObject(doc, func(k string, raw []byte) { got[k] = raw })
	var want map[string]json.RawMessage
	werr := json.Unmarshal(doc, &want)
	valid := json.Valid(doc)
	switch {
	case !valid:
		if err == nil {
			t.Fatalf("%q: accepted, encoding/json: %v", doc, werr)
		}
		return
	case werr != nil || want == nil: // valid JSON, not an object (null decodes to a nil map)
		if !errors.Is(err, errNotObject) {
			t.Fatalf("%q: err %v, want errNotObject (encoding/json: %v)", doc, err, werr)
		}
		return
	case err != nil:
		t.Fatalf("%q: %v, but encoding/json accepts it", doc, err)
	}
	for k, v := range want {
		if !utf8.ValidString(k) || strings.ContainsRune(k, utf8.RuneError) {
			continue // encoding/json replaces invalid UTF-8 in keys
		}
		if g, ok := got[k]; !ok || !bytes.Equal(g, v) {
			t.Fatalf("%q: member %q = %q, encoding/json %q", doc, k, g, v)
		}
	}
}

func TestScanObject(t *testing.T) {
	for _, doc := range []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":1,"a":2}`, `{"model":"m","messages":[{"role":"user","content":"x\n\u00e9\"\\"}]}`,
		`{"a":[1,-0,0.5,1e3,-1.2E-7,true,false,null,{},[],""]}`, `{"\u006dodel":"x"}`, `{"k":"\ud800"}`,
		`[]`, `null`, `1`, `"s"`, `true`,
		``, ` `, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":1 "b":2}`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`,
		`{"a":.5}`, `{"a":+1}`, `{"a":tru}`, `{"a":nul}`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", `{"a":"open}`,
		`{"a":[1,]}`, `{"a":[1 2]}`, `{} {}`, `{}x`, `{'a':1}`, `{"a":1}}`, `{"a":[}`, "{\"a\":\"\xff\"}", "{\"\xff\":1}",
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001), `{"a":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}`,
		`{"a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`, `{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
	} {
		checkScan(t, []byte(doc))
	}
}

func TestScanObjectKeysFold(t *testing.T) {
	p, e := ParsePrompt("/v1/completions", []byte(`{"MODEL":"a","Prompt":"x","model":"b","\u0053tream":true}`))
	if e != nil || p.Model != "b" || p.Tokenize.Text != "x" || !p.Stream {
		t.Errorf("%+v %v: keys must match as encoding/json matches struct fields", p, e)
	}
	// Members of another kind's body are not decoded: a completion's
	// "instructions" of the wrong type is not an error.
	if _, e := ParsePrompt("/v1/completions", []byte(`{"model":"a","prompt":"x","instructions":5}`)); e != nil {
		t.Errorf("an unread member failed the request: %v", e)
	}
	if _, e := ParsePrompt("/v1/responses", []byte(`{"model":"a","input":"x","instructions":5}`)); e == nil || e.Status != 400 {
		t.Errorf("instructions of the wrong type: %v, want 400", e)
	}
}

func FuzzScanObject(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"model":"m","messages":[{"role":"user","content":"x\u00e9"}]}`, `[1,2]`, `{"a":[1e5,-0.1,true,null]}`, `{"a`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) { checkScan(t, doc) })
}

func BenchmarkParsePromptChat(b *testing.B) {
	var msgs []map[string]string
	for i := range 24 {
		msgs = append(msgs, map[string]string{"role": "user", "content": strings.Repeat("word and \"quoted\" text é ", 60+i)})
	}
	raw, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": true})
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, e := ParsePrompt("/v1/chat/completions", raw); e != nil {
			b.Fatal(e)
		}
	}
}

// checkTokenIDs compares tokenIDs with json.Unmarshal into a []uint32 on
// raw: where the fast path answers, encoding/json must agree.
func checkTokenIDs(t *testing.T, raw []byte) (fast bool) {
	t.Helper()
	got, ok := tokenIDs(raw)
	if !ok {
		return false
	}
	var want []uint32
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatalf("%q: tokenIDs read %v, encoding/json: %v", raw, got, err)
	}
	if !slices.Equal(got, want) || got == nil {
		t.Fatalf("%q: tokenIDs %v, encoding/json %v", raw, got, want)
	}
	return true
}

func TestTokenIDs(t *testing.T) {
	for _, c := range []struct {
		raw  string
		fast bool // the fast path answers (else encoding/json decides)
	}{
		{`[]`, true}, {` [ ] `, true}, {`[0]`, true}, {`[1,2,3]`, true}, {"[ 1 ,\n2\t,3 ]\r\n", true},
		{`[4294967295]`, true}, {`[4294967296]`, false}, {`[99999999999]`, false}, {`[00]`, false}, {`[01]`, false},
		{`[-1]`, false}, {`[1.0]`, false}, {`[1e3]`, false}, {`[1,null]`, false}, {`[[1]]`, false}, {`["1"]`, false},
		{`[1,]`, false}, {`[1 2]`, false}, {`[1`, false}, {`[`, false}, {`1`, false}, {`"x"`, false}, {`[1]x`, false}, {``, false},
	} {
		if fast := checkTokenIDs(t, []byte(c.raw)); fast != c.fast {
			t.Errorf("%q: fast path %v, want %v", c.raw, fast, c.fast)
		}
	}
	// Through ParsePrompt, with the fallback: null elements decode as 0 (as
	// encoding/json does), out-of-range ids fail.
	for _, c := range []struct {
		body string
		ids  []uint32
		ok   bool
	}{
		{`{"model":"m","prompt":[7, 8,9]}`, []uint32{7, 8, 9}, true},
		{`{"model":"m","prompt":[7,null]}`, []uint32{7, 0}, true},
		{`{"model":"m","prompt":[7,-1]}`, nil, false},
		{`{"model":"m","prompt":[4294967296]}`, nil, false},
		{`{"model":"m","prompt":[]}`, nil, false},
	} {
		p, e := ParsePrompt("/v1/completions", []byte(c.body))
		if (e == nil) != c.ok || c.ok && !slices.Equal(p.IDs, c.ids) {
			t.Errorf("%s: ids %v err %v, want %v ok %v", c.body, p.IDs, e, c.ids, c.ok)
		}
	}
}

func FuzzTokenIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, ` [ 4294967295 , 0 ] `, `[1.5]`, `[01]`, `[-0]`, `[1,null]`, `[[1],[2]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkTokenIDs(t, raw) })
}

func BenchmarkTokenIDs(b *testing.B) {
	ids := make([]uint32, 12000)
	for i := range ids {
		ids[i] = uint32(i * 7919 % 151000)
	}
	raw, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids})
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, e := ParsePrompt("/v1/completions", raw); e != nil {
			b.Fatal(e)
		}
	}
}
