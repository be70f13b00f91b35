package jinja

// An insertion-ordered JSON decoder producing chat-template values with the semantics of
// Python's json.loads, which is what vLLM (FastAPI) applies to a request body:
//
//   - objects keep their keys in received order; a repeated key keeps the position of
//     its first occurrence and the value of its last (dict(pairs));
//   - integers are exact at any size (Python int), numbers with a fraction or exponent
//     are float64 (1 stays 1, 1.0 stays 1.0, 1e400 is inf);
//   - NaN, Infinity and -Infinity are accepted, as json.loads does;
//   - raw control characters inside strings and invalid UTF-8 are errors.
//
// One deliberate difference: a lone UTF-16 surrogate escape ("\ud800") becomes U+FFFD,
// because a Go string cannot hold it (Python keeps it and the engine's tokenizer then
// rejects the text).

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

const jsonMaxDepth = 1000

type jsonDecoder struct {
	data  string
	pos   int
	depth int
}

// DecodeJSON decodes one JSON document as Python's json.loads does: objects keep their
// keys in order (a repeated key keeps its first position and its last value), integers
// are exact at any size, numbers with a fraction or exponent are floats, and NaN and
// ±Infinity are accepted. Invalid UTF-8 is an error; a lone UTF-16 surrogate escape
// becomes U+FFFD.
func DecodeJSON(data []byte) (Value, error) {
	if !utf8.Valid(data) {
		return Value{}, errors.New("json: invalid UTF-8")
	}
	d := &jsonDecoder{data: string(data)}
	d.skipWS()
	v, err := d.value()
	if err != nil {
		return Value{}, err
	}
	d.skipWS()
	if d.pos != len(d.data) {
		return Value{}, d.errorf("Extra data")
	}
	return v, nil
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("json: %s at offset %d", fmt.Sprintf(format, args...), d.pos)
}

func (d *jsonDecoder) skipWS() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value() (Value, error) {
	if d.pos >= len(d.data) {
		return Value{}, d.errorf("Expecting value")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object()
	case c == '[':
		return d.array()
	case c == '"':
		s, err := d.str()
		if err != nil {
			return Value{}, err
		}
		return StringValue(s), nil
	case c == '-' || (c >= '0' && c <= '9'):
		if strings.HasPrefix(d.data[d.pos:], "-Infinity") {
			d.pos += len("-Infinity")
			return floatValue(math.Inf(-1)), nil
		}
		return d.number()
	case strings.HasPrefix(d.data[d.pos:], "true"):
		d.pos += 4
		return trueValue, nil
	case strings.HasPrefix(d.data[d.pos:], "false"):
		d.pos += 5
		return falseValue, nil
	case strings.HasPrefix(d.data[d.pos:], "null"):
		d.pos += 4
		return noneValue, nil
	case strings.HasPrefix(d.data[d.pos:], "NaN"):
		d.pos += 3
		return floatValue(math.NaN()), nil
	case strings.HasPrefix(d.data[d.pos:], "Infinity"):
		d.pos += len("Infinity")
		return floatValue(math.Inf(1)), nil
	}
	return Value{}, d.errorf("Expecting value")
}

func (d *jsonDecoder) enter() error {
	d.depth++
	if d.depth > jsonMaxDepth {
		return d.errorf("maximum nesting depth exceeded")
	}
	return nil
}

func (d *jsonDecoder) object() (Value, error) {
	if err := d.enter(); err != nil {
		return Value{}, err
	}
	defer func() { d.depth-- }()
	d.pos++ // {
	dict := &Dict{}
	var index map[string]int
	d.skipWS()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return DictValue(dict), nil
	}
	for {
		d.skipWS()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return Value{}, d.errorf("Expecting property name enclosed in double quotes")
		}
		key, err := d.str()
		if err != nil {
			return Value{}, err
		}
		d.skipWS()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return Value{}, d.errorf("Expecting ':' delimiter")
		}
		d.pos++
		d.skipWS()
		val, err := d.value()
		if err != nil {
			return Value{}, err
		}
		// a repeated key keeps its first position and takes the last value
		dup := -1
		if index != nil {
			if i, ok := index[key]; ok {
				dup = i
			}
		} else {
			for i := range dict.keys {
				if dict.keys[i].s == key {
					dup = i
					break
				}
			}
		}
		if dup >= 0 {
			dict.vals[dup] = val
		} else {
			dict.keys = append(dict.keys, StringValue(key))
			dict.vals = append(dict.vals, val)
			if index != nil {
				index[key] = len(dict.keys) - 1
			} else if len(dict.keys) > 16 {
				index = make(map[string]int, 2*len(dict.keys))
				for i, k := range dict.keys {
					index[k.s] = i
				}
			}
		}
		d.skipWS()
		if d.pos >= len(d.data) {
			return Value{}, d.errorf("Expecting ',' delimiter")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return DictValue(dict), nil
		default:
			return Value{}, d.errorf("Expecting ',' delimiter")
		}
	}
}

func (d *jsonDecoder) array() (Value, error) {
	if err := d.enter(); err != nil {
		return Value{}, err
	}
	defer func() { d.depth-- }()
	d.pos++ // [
	var items []Value
	d.skipWS()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return ListValue(items), nil
	}
	for {
		d.skipWS()
		v, err := d.value()
		if err != nil {
			return Value{}, err
		}
		items = append(items, v)
		d.skipWS()
		if d.pos >= len(d.data) {
			return Value{}, d.errorf("Expecting ',' delimiter")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return ListValue(items), nil
		default:
			return Value{}, d.errorf("Expecting ',' delimiter")
		}
	}
}

func (d *jsonDecoder) number() (Value, error) {
	s := d.data
	start := d.pos
	i := start
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return Value{}, d.errorf("Expecting value")
	}
	isFloat := false
	if i+1 < len(s) && s[i] == '.' && s[i+1] >= '0' && s[i+1] <= '9' {
		isFloat = true
		i += 2
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && s[j] >= '0' && s[j] <= '9' {
			isFloat = true
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			i = j
		}
	}
	d.pos = i
	text := s[start:i]
	if isFloat {
		f, err := parseFloat(text)
		if err != nil {
			return Value{}, d.errorf("invalid number %s", text)
		}
		return floatValue(f), nil
	}
	v, ok := parseIntBase(text, 10)
	if !ok {
		return Value{}, d.errorf("invalid number %s", text)
	}
	return v, nil
}

// parseFloat is Python's float() of a decimal literal: overflow gives ±inf.
func parseFloat(text string) (float64, error) {
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return f, nil
		}
		return 0, err
	}
	return f, nil
}

// parseIntBase parses an optionally signed integer of any size.
func parseIntBase(text string, base int) (Value, bool) {
	if n, err := strconv.ParseInt(text, base, 64); err == nil {
		return intValue(n), true
	}
	b, ok := new(big.Int).SetString(text, base)
	if !ok {
		return Value{}, false
	}
	return bigValue(b), true
}

func (d *jsonDecoder) str() (string, error) {
	s := d.data
	d.pos++ // opening quote
	start := d.pos
	// fast path: no escapes
	i := start
	for ; i < len(s); i++ {
		c := s[i]
		if c == '"' {
			d.pos = i + 1
			return s[start:i], nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			d.pos = i
			return "", d.errorf("Invalid control character")
		}
	}
	// s[start:i] has no escapes. The unescaped string is at most as long
	// as the rest of the literal: find its end for one allocation.
	end := i
	for end < len(s) && s[end] != '"' {
		if s[end] == '\\' {
			end++
		}
		end++
	}
	var b strings.Builder
	b.Grow(min(end, len(s)) - start)
	b.WriteString(s[start:i])
	for {
		if i >= len(s) {
			d.pos = start - 1
			return "", d.errorf("Unterminated string starting")
		}
		c := s[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return b.String(), nil
		case c < 0x20:
			d.pos = i
			return "", d.errorf("Invalid control character")
		case c != '\\':
			// Copy the run up to the next quote, escape or control character at once.
			j := i + 1
			for j < len(s) && s[j] != '"' && s[j] != '\\' && s[j] >= 0x20 {
				j++
			}
			b.WriteString(s[i:j])
			i = j
			continue
		}
		if i+1 >= len(s) {
			d.pos = start - 1
			return "", d.errorf("Unterminated string starting")
		}
		e := s[i+1]
		i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := hex4(s, i)
			if !ok {
				d.pos = i
				return "", d.errorf("Invalid \\uXXXX escape")
			}
			i += 4
			if utf16.IsSurrogate(r) {
				if r < 0xdc00 && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if r2, ok := hex4(s, i+2); ok && r2 >= 0xdc00 && r2 <= 0xdfff {
						r = utf16.DecodeRune(r, r2)
						i += 6
						b.WriteRune(r)
						continue
					}
				}
				r = utf8.RuneError
			}
			b.WriteRune(r)
		default:
			d.pos = i - 1
			return "", d.errorf("Invalid \\escape")
		}
	}
}

func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for k := 0; k < 4; k++ {
		c := s[i+k]
		switch {
		case c >= '0' && c <= '9':
			r = r*16 + rune(c-'0')
		case c|0x20 >= 'a' && c|0x20 <= 'f':
			r = r*16 + rune(c|0x20-'a'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// ---- encoding: Python json.dumps ----

// dumpOptions are the arguments of transformers' tojson filter (json.dumps with
// ensure_ascii=False by default).
type dumpOptions struct {
	ensureASCII bool
	indent      *string // nil: no indentation
	itemSep     string
	keySep      string
	sortKeys    bool
}

// dumpJSON is json.dumps(v, ...).
func dumpJSON(v Value, opt *dumpOptions) (string, error) {
	var b strings.Builder
	if err := dump(&b, v, opt, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func dump(b *strings.Builder, v Value, opt *dumpOptions, level int) error {
	switch v.k {
	case KindNone:
		b.WriteString("null")
	case KindBool:
		if v.n != 0 {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case KindInt:
		b.WriteString(strconv.FormatInt(v.n, 10))
	case kindBig:
		b.WriteString(v.o.(*big.Int).String())
	case KindFloat:
		b.WriteString(jsonFloat(v.f))
	case KindString:
		dumpString(b, v.s, opt.ensureASCII)
	case KindList, kindTuple:
		items := v.list().items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(opt.itemSep)
			}
			dumpNewline(b, opt, level+1)
			if err := dump(b, it, opt, level+1); err != nil {
				return err
			}
		}
		dumpNewline(b, opt, level)
		b.WriteByte(']')
	case KindDict:
		d := v.dict()
		if len(d.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		order := make([]int, len(d.keys))
		for i := range order {
			order[i] = i
		}
		keys := make([]string, len(d.keys))
		for i, k := range d.keys {
			switch k.k {
			case KindString:
				keys[i] = k.s
			case KindFloat:
				keys[i] = jsonFloat(k.f)
			case KindInt, kindBig:
				keys[i] = k.String()
			case KindBool:
				keys[i] = map[bool]string{true: "true", false: "false"}[k.n != 0]
			case KindNone:
				keys[i] = "null"
			default:
				return errorf("TypeError", "keys must be str, int, float, bool or None, not %s", k.TypeName())
			}
		}
		if opt.sortKeys {
			for _, k := range d.keys {
				if k.k != KindString {
					return errorf("TypeError", "'<' not supported between instances of '%s' and 'str'", k.TypeName())
				}
			}
			sortInts(order, func(a, b int) bool { return keys[a] < keys[b] })
		}
		b.WriteByte('{')
		for n, i := range order {
			if n > 0 {
				b.WriteString(opt.itemSep)
			}
			dumpNewline(b, opt, level+1)
			dumpString(b, keys[i], opt.ensureASCII)
			b.WriteString(opt.keySep)
			if err := dump(b, d.vals[i], opt, level+1); err != nil {
				return err
			}
		}
		dumpNewline(b, opt, level)
		b.WriteByte('}')
	default:
		return errorf("TypeError", "Object of type %s is not JSON serializable", v.TypeName())
	}
	return nil
}

func dumpNewline(b *strings.Builder, opt *dumpOptions, level int) {
	if opt.indent == nil {
		return
	}
	b.WriteByte('\n')
	for i := 0; i < level; i++ {
		b.WriteString(*opt.indent)
	}
}

// jsonFloat is float.__repr__ with json's spellings of the non-finite values.
func jsonFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return floatRepr(f)
}

// dumpString writes a JSON string the way json.dumps does.
func dumpString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && (c < utf8.RuneSelf || !ensureASCII) {
			i++
			continue
		}
		b.WriteString(s[start:i])
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r >= 0x10000 {
				r1, r2 := utf16.EncodeRune(r)
				b.WriteString(`\u` + hex(uint32(r1), 4) + `\u` + hex(uint32(r2), 4))
			} else {
				b.WriteString(`\u` + hex(uint32(r), 4))
			}
			i += size
			start = i
			continue
		}
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			b.WriteString(`\u00` + hex(uint32(c), 2))
		}
		i++
		start = i
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

// sortInts is a stable insertion/merge sort of indexes (Python's sort is stable).
func sortInts(a []int, less func(x, y int) bool) {
	if len(a) < 2 {
		return
	}
	tmp := make([]int, len(a))
	mergeSort(a, tmp, less)
}

func mergeSort(a, tmp []int, less func(x, y int) bool) {
	if len(a) <= 12 {
		for i := 1; i < len(a); i++ {
			for j := i; j > 0 && less(a[j], a[j-1]); j-- {
				a[j], a[j-1] = a[j-1], a[j]
			}
		}
		return
	}
	m := len(a) / 2
	mergeSort(a[:m], tmp[:m], less)
	mergeSort(a[m:], tmp[m:], less)
	copy(tmp, a)
	i, j, k := 0, m, 0
	for i < m && j < len(a) {
		if less(tmp[j], tmp[i]) {
			a[k] = tmp[j]
			j++
		} else {
			a[k] = tmp[i]
			i++
		}
		k++
	}
	for i < m {
		a[k] = tmp[i]
		i++
		k++
	}
	for j < len(a) {
		a[k] = tmp[j]
		j++
		k++
	}
}
