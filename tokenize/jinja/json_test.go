package jinja

import (
	"strings"
	"testing"
)

func jsonDumpsDefault(t *testing.T, v Value) string {
	t.Helper()
	s, err := dumpJSON(v, &dumpOptions{itemSep: ", ", keySep: ": "})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Expected values were produced by Python: json.dumps(json.loads(in), ensure_ascii=False).
func TestJSONRoundTripLikePython(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"b": 1, "a": [1, 2.0, -0, 1e2, 1E400, 12345678901234567890, -1.5e-7], "b": {"x": null, "y": true, "z": false}}`,
			`{"b": {"x": null, "y": true, "z": false}, "a": [1, 2.0, 0, 100.0, Infinity, 12345678901234567890, -1.5e-07]}`},
		{`"\ud83d\ude00 \u00e9 \n\t\"\\\/"`, "\"😀 é \\n\\t\\\"\\\\/\""},
		{`[NaN, Infinity, -Infinity]`, `[NaN, Infinity, -Infinity]`},
		{"  {\"k\" : [ ] , \"e\" : { } }  ", `{"k": [], "e": {}}`},
		{`[0.1, 1e16, 1e15, 100.0, 5e-324, 1.7976931348623157e308]`, `[0.1, 1e+16, 1000000000000000.0, 100.0, 5e-324, 1.7976931348623157e+308]`},
		{`{"a\u0000b": "\u001f\u007f\u2028"}`, "{\"a\\u0000b\": \"\\u001f\u007f\u2028\"}"},
		{`"\ud800x"`, "\"\uFFFDx\""}, // Python keeps the lone surrogate; Go cannot
	} {
		v, err := DecodeJSON([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if got := jsonDumpsDefault(t, v); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

func TestJSONDecodeErrors(t *testing.T) {
	for _, in := range []string{`[1,]`, `{"a":1,}`, `01`, `[1] x`, `"abc`, `{"a" 1}`, "\"\x01\"", `tru`, ``, `-`, `1.`, `.5`, `+1`, `"\x"`, `{'a':1}`, `[1 2]`, `"\u12"`, "\"\xff\"", strings.Repeat("[", 1001) + strings.Repeat("]", 1001)} {
		if v, err := DecodeJSON([]byte(in)); err == nil {
			t.Errorf("%q: want an error, got %s", in, v.Repr())
		}
	}
	if _, err := DecodeJSON([]byte(strings.Repeat("[", 1000) + strings.Repeat("]", 1000))); err != nil {
		t.Errorf("nesting 1000: %v", err)
	}
}

func TestJSONValueKinds(t *testing.T) {
	v, err := DecodeJSON([]byte(`{"i": 1, "f": 1.0, "e": 1e2, "big": -123456789012345678901234567890, "s": "x", "n": null, "t": true, "l": [], "o": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	d := v.dict()
	want := map[string]Kind{"i": KindInt, "f": KindFloat, "e": KindFloat, "big": kindBig, "s": KindString, "n": KindNone, "t": KindBool, "l": KindList, "o": KindDict}
	for k, kind := range want {
		got, ok := d.Get(k)
		if !ok || got.k != kind {
			t.Errorf("%s: kind %v, want %v", k, got.k, kind)
		}
	}
	if got := mustGet(t, d, "big").String(); got != "-123456789012345678901234567890" {
		t.Errorf("big int printed as %s", got)
	}
	var keys []string
	for _, k := range d.keys {
		keys = append(keys, k.s)
	}
	if strings.Join(keys, ",") != "i,f,e,big,s,n,t,l,o" {
		t.Errorf("key order %v", keys)
	}
}

func TestJSONDuplicateKeysMany(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i < 40; i++ {
		b.WriteString(`"k` + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `": 1, `)
	}
	b.WriteString(`"ka": 2, "kb": 3, "ka": 4}`)
	v, err := DecodeJSON([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	d := v.dict()
	if d.keys[0].s != "kaa" || len(d.keys) != 42 {
		t.Fatalf("unexpected keys: %d first %s", len(d.keys), d.keys[0].s)
	}
	if got := mustGet(t, d, "ka"); got.n != 4 {
		t.Errorf("duplicate key kept %d, want the last value 4", got.n)
	}
	if d.keys[40].s != "ka" {
		t.Errorf("duplicate key moved: position 40 is %s", d.keys[40].s)
	}
}

func mustGet(t *testing.T, d *Dict, k string) Value {
	t.Helper()
	v, ok := d.Get(k)
	if !ok {
		t.Fatalf("missing key %s", k)
	}
	return v
}

func TestJSONDumpOptions(t *testing.T) {
	v, err := DecodeJSON([]byte(`{"b": [1, {"c": "é"}], "a": {}}`))
	if err != nil {
		t.Fatal(err)
	}
	two := "  "
	for _, tc := range []struct {
		opt  dumpOptions
		want string
	}{
		{dumpOptions{itemSep: ", ", keySep: ": "}, `{"b": [1, {"c": "é"}], "a": {}}`},
		{dumpOptions{itemSep: ",", keySep: ":"}, `{"b":[1,{"c":"é"}],"a":{}}`},
		{dumpOptions{itemSep: ", ", keySep: ": ", ensureASCII: true}, `{"b": [1, {"c": "\u00e9"}], "a": {}}`},
		{dumpOptions{itemSep: ", ", keySep: ": ", sortKeys: true}, `{"a": {}, "b": [1, {"c": "é"}]}`},
		{dumpOptions{itemSep: ",", keySep: ": ", indent: &two}, "{\n  \"b\": [\n    1,\n    {\n      \"c\": \"é\"\n    }\n  ],\n  \"a\": {}\n}"},
	} {
		got, err := dumpJSON(v, &tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
	if _, err := dumpJSON(undefinedValue, &dumpOptions{}); err == nil || err.Error() != "Object of type Undefined is not JSON serializable" {
		t.Errorf("undefined: %v", err)
	}
}

func TestFloatRepr(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0.0", 1: "1.0", -2.5: "-2.5", 0.1: "0.1", 1e16: "1e+16", 1e15: "1000000000000000.0",
		1e-4: "0.0001", 1e-5: "1e-05", 123456789.123: "123456789.123", 1.5e300: "1.5e+300", 5e-324: "5e-324",
		12345678901234567.0: "1.2345678901234568e+16", 0.30000000000000004: "0.30000000000000004",
	} {
		if got := floatRepr(f); got != want {
			t.Errorf("repr(%v) = %s, want %s", f, got, want)
		}
	}
}
