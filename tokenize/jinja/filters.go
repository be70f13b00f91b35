package jinja

// Filters of strings and numbers: jinja2's filters.py (and the transformers tojson)
// for the filters that take or produce text and numbers.

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

func jfAbs(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	if _, err := jBind("abs", nil, args, kw); err != nil {
		return jv{}, err
	}
	switch v.k {
	case jkInt, jkBool:
		if v.n < 0 {
			return jNeg(v)
		}
		return jIntV(v.n), nil
	case jkBig:
		return jBigV(new(big.Int).Abs(v.o.(*big.Int))), nil
	case jkFloat:
		return jFloatV(math.Abs(v.f)), nil
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return jv{}, jErrorf("TypeError", "bad operand type for abs(): '%s'", jValueTypeName(v))
}

func jfCapitalize(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	return jStrV(jCapitalizeStr(jSoftStr(v))), nil
}

func jfCenter(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("center", []string{"width"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	w := 80
	if a[0].k != jkMissing {
		if w, err = jWantInt("center", a[0]); err != nil {
			return jv{}, err
		}
	}
	return jStrV(jCenterStr(jSoftStr(v), w, " ")), nil
}

func jfDefault(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("default", []string{"default_value", "boolean"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	def := jOr(a[0], jvEmptyStr)
	if v.k == jkUndef || (jTruthy(jOr(a[1], jvFalse)) && !jTruthy(v)) {
		return def, nil
	}
	return v, nil
}

func jHTMLEscape(s string) string {
	if !strings.ContainsAny(s, "&<>'\"") {
		return s
	}
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&#39;", "\"", "&#34;")
	return r.Replace(s)
}

func jfEscape(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	return jStrV(jHTMLEscape(jSoftStr(v))), nil
}

// jPyFloatFromString is Python's float(str).
func jPyFloatFromString(s string) (float64, bool) {
	t := strings.ReplaceAll(jPyStrip(s), "_", "")
	if strings.Contains(jPyStrip(s), "__") || strings.HasPrefix(jPyStrip(s), "_") || strings.HasSuffix(jPyStrip(s), "_") {
		return 0, false
	}
	switch strings.ToLower(strings.TrimLeft(t, "+-")) {
	case "inf", "infinity":
		if strings.HasPrefix(t, "-") {
			return math.Inf(-1), true
		}
		return math.Inf(1), true
	case "nan":
		return math.NaN(), true
	}
	if strings.ContainsAny(t, "xXpP") {
		return 0, false
	}
	f, err := jParseFloat(t)
	if err != nil {
		return 0, false
	}
	return f, true
}

func jfFloat(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("float", []string{"default"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	def := jOr(a[0], jFloatV(0))
	switch v.k {
	case jkFloat:
		return v, nil
	case jkInt, jkBool, jkBig:
		f, err := jAsFloat(v)
		if err != nil {
			return jv{}, err
		}
		return jFloatV(f), nil
	case jkStr:
		if f, ok := jPyFloatFromString(v.s); ok {
			return jFloatV(f), nil
		}
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return def, nil
}

func jfFormat(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 && len(kw.names) > 0 {
		return jv{}, jErrorf("FilterArgumentError", "can't handle positional and keyword arguments at the same time")
	}
	var arg jv
	if len(kw.names) > 0 {
		d := jNewDict(len(kw.names))
		for i, n := range kw.names {
			d.set(jStrV(n), kw.vals[i])
		}
		arg = jDictV(d)
	} else {
		arg = jTupleV(args)
	}
	s, err := jPercentFormat(jSoftStr(v), arg)
	if err != nil {
		return jv{}, err
	}
	return jStrV(s), nil
}

// jSplitlines is Python's str.splitlines(keepends).
func jSplitlines(s string, keepends bool) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		brk := 0
		switch r {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			brk = size
		case '\r':
			brk = 1
			if i+1 < len(s) && s[i+1] == '\n' {
				brk = 2
			}
		}
		if brk == 0 {
			i += size
			continue
		}
		if keepends {
			out = append(out, s[start:i+brk])
		} else {
			out = append(out, s[start:i])
		}
		i += brk
		start = i
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func jfIndent(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("indent", []string{"width", "first", "blank"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	indention := "    "
	switch w := a[0]; w.k {
	case jkMissing:
	case jkStr:
		indention = w.s
	default:
		n, err := jWantInt("indent", w)
		if err != nil {
			return jv{}, err
		}
		if n < 0 {
			n = 0
		}
		indention = strings.Repeat(" ", n)
	}
	s := jSoftStr(v) + "\n"
	lines := jSplitlines(s, false)
	var rv string
	if jTruthy(jOr(a[2], jvFalse)) {
		rv = strings.Join(lines, "\n"+indention)
	} else {
		rv = lines[0]
		if len(lines) > 1 {
			var b strings.Builder
			b.WriteString(rv)
			b.WriteString("\n")
			for i, l := range lines[1:] {
				if i > 0 {
					b.WriteString("\n")
				}
				if l != "" {
					b.WriteString(indention)
				}
				b.WriteString(l)
			}
			rv = b.String()
		}
	}
	if jTruthy(jOr(a[1], jvFalse)) {
		rv = indention + rv
	}
	return jStrV(rv), nil
}

// jPyIntFromString is Python's int(str, base).
func jPyIntFromString(s string, base int) (jv, bool) {
	t := jPyStrip(s)
	neg := false
	if strings.HasPrefix(t, "+") || strings.HasPrefix(t, "-") {
		neg = t[0] == '-'
		t = t[1:]
	}
	if base == 0 || base == 16 || base == 8 || base == 2 {
		lower := strings.ToLower(t)
		prefixBase := 0
		switch {
		case strings.HasPrefix(lower, "0x"):
			prefixBase = 16
		case strings.HasPrefix(lower, "0o"):
			prefixBase = 8
		case strings.HasPrefix(lower, "0b"):
			prefixBase = 2
		}
		if prefixBase != 0 && (base == 0 || base == prefixBase) {
			base = prefixBase
			t = t[2:]
			if strings.HasPrefix(t, "_") {
				t = t[1:]
			}
		} else if base == 0 {
			base = 10
			if len(t) > 1 && t[0] == '0' && strings.Trim(t, "0_") != "" {
				return jv{}, false
			}
		}
	}
	if t == "" || strings.HasPrefix(t, "_") || strings.HasSuffix(t, "_") || strings.Contains(t, "__") {
		return jv{}, false
	}
	t = strings.ReplaceAll(t, "_", "")
	if base < 2 || base > 36 {
		return jv{}, false
	}
	b, ok := new(big.Int).SetString(t, base)
	if !ok {
		return jv{}, false
	}
	if neg {
		b.Neg(b)
	}
	return jBigV(b), true
}

func jfInt(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("int", []string{"default", "base"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	def := jOr(a[0], jIntV(0))
	base := 10
	if a[1].k != jkMissing {
		if base, err = jWantInt("int", a[1]); err != nil {
			return jv{}, err
		}
	}
	switch v.k {
	case jkInt, jkBig:
		return v, nil
	case jkBool:
		return jIntV(v.n), nil
	case jkFloat:
		if math.IsInf(v.f, 0) {
			return jv{}, jErrorf("OverflowError", "cannot convert float infinity to integer")
		}
		if math.IsNaN(v.f) {
			return def, nil
		}
		b, _ := new(big.Float).SetFloat64(math.Trunc(v.f)).Int(nil)
		return jBigV(b), nil
	case jkStr:
		if r, ok := jPyIntFromString(v.s, base); ok {
			return r, nil
		}
		if f, ok := jPyFloatFromString(v.s); ok {
			if math.IsInf(f, 0) {
				return jv{}, jErrorf("OverflowError", "cannot convert float infinity to integer")
			}
			if math.IsNaN(f) {
				return def, nil
			}
			b, _ := new(big.Float).SetFloat64(math.Trunc(f)).Int(nil)
			return jBigV(b), nil
		}
	case jkUndef:
		return jv{}, jUndefError(v)
	}
	return def, nil
}

func jfLower(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	return jStrV(jLowerStr(jSoftStr(v))), nil
}

func jfUpper(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	return jStrV(jUpperStr(jSoftStr(v))), nil
}

func jfPprint(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) { return jStrV(jRepr(v)), nil }

func jfReplace(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("replace", []string{"old", "new", "count"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if a[0].k == jkMissing || a[1].k == jkMissing {
		return jv{}, jErrorf("TypeError", "do_replace() missing required arguments")
	}
	n := -1
	if a[2].k != jkMissing && a[2].k != jkNone {
		if n, err = jWantInt("replace", a[2]); err != nil {
			return jv{}, err
		}
	}
	return jStrV(jPyReplace(jSoftStr(v), jSoftStr(a[0]), jSoftStr(a[1]), n)), nil
}

func jPyReplace(s, old, repl string, n int) string {
	if n < 0 {
		n = -1
	}
	return strings.Replace(s, old, repl, n)
}

func jfRound(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("round", []string{"precision", "method"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	prec := 0
	if a[0].k != jkMissing {
		if prec, err = jWantInt("round", a[0]); err != nil {
			return jv{}, err
		}
	}
	method := "common"
	if a[1].k != jkMissing {
		if method, err = jWantStr("round", a[1]); err != nil {
			return jv{}, err
		}
	}
	if method != "common" && method != "ceil" && method != "floor" {
		return jv{}, jErrorf("FilterArgumentError", "method must be common, ceil or floor")
	}
	if !v.isNumber() {
		if v.k == jkUndef {
			return jv{}, jUndefError(v)
		}
		return jv{}, jErrorf("TypeError", "type %s doesn't define __round__ method", jValueTypeName(v))
	}
	if method == "common" {
		if v.k != jkFloat {
			if prec >= 0 {
				return jPos(v)
			}
			f, _ := jAsFloat(v)
			p := math.Pow(10, float64(-prec))
			r := math.RoundToEven(f/p) * p
			b, _ := new(big.Float).SetFloat64(r).Int(nil)
			return jBigV(b), nil
		}
		return jFloatV(jPyRound(v.f, prec)), nil
	}
	f, err := jAsFloat(v)
	if err != nil {
		return jv{}, err
	}
	p := math.Pow(10, float64(prec))
	if method == "ceil" {
		return jFloatV(math.Ceil(f*p) / p), nil
	}
	return jFloatV(math.Floor(f*p) / p), nil
}

// jPyRound is Python's round(float, ndigits): correctly rounded, ties to even.
func jPyRound(f float64, nd int) float64 {
	if math.IsInf(f, 0) || math.IsNaN(f) || f == 0 {
		return f
	}
	if nd > 300 {
		return f
	}
	if nd < -308 {
		return math.Copysign(0, f)
	}
	if nd >= 0 {
		s := strconv.FormatFloat(f, 'f', nd, 64)
		r, _ := strconv.ParseFloat(s, 64)
		return r
	}
	p := math.Pow(10, float64(-nd))
	return math.RoundToEven(f/p) * p
}

func jfSafe(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) { return v, nil }

func jfString(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) { return jStrV(jSoftStr(v)), nil }

// jfTitle is jinja2's do_title: capitalise after runs of "-", whitespace, "(", "{",
// "[" and "<" (not str.title).
func jfTitle(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	s := jSoftStr(v)
	var b strings.Builder
	isSep := func(r rune) bool {
		return r == '-' || r == '(' || r == '{' || r == '[' || r == '<' || jPyIsSpace(r)
	}
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if isSep(r) {
			b.WriteRune(r)
			i += size
			continue
		}
		j := i
		for j < len(s) {
			r2, s2 := utf8.DecodeRuneInString(s[j:])
			if isSep(r2) {
				break
			}
			j += s2
		}
		word := s[i:j]
		_, fs := utf8.DecodeRuneInString(word)
		b.WriteString(jUpperStr(word[:fs]))
		b.WriteString(jLowerStr(word[fs:]))
		i = j
	}
	return jStrV(b.String()), nil
}

func jfToJSON(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("tojson", []string{"ensure_ascii", "indent", "separators", "sort_keys"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	opt := jDumpOptions{itemSep: ", ", keySep: ": "}
	opt.ensureASCII = jTruthy(jOr(a[0], jvFalse))
	switch ind := jOr(a[1], jvNone); ind.k {
	case jkNone:
	case jkStr:
		s := ind.s
		opt.indent = &s
	case jkInt, jkBool:
		n := int(ind.n)
		if n < 0 {
			n = 0
		}
		if n > 1000 {
			return jv{}, jErrorf("ValueError", "indent too large")
		}
		s := strings.Repeat(" ", n)
		opt.indent = &s
	default:
		return jv{}, jErrorf("TypeError", "indent must be an int or a str, not %s", jValueTypeName(ind))
	}
	if opt.indent != nil {
		opt.itemSep = ","
	}
	if sep := jOr(a[2], jvNone); sep.k != jkNone {
		items, err := jIterate(sep)
		if err != nil || len(items) != 2 || items[0].k != jkStr || items[1].k != jkStr {
			return jv{}, jErrorf("ValueError", "separators must be a (item_separator, key_separator) pair of strings")
		}
		opt.itemSep, opt.keySep = items[0].s, items[1].s
	}
	opt.sortKeys = jTruthy(jOr(a[3], jvFalse))
	s, err := jDumpJSON(v, &opt)
	if err != nil {
		return jv{}, err
	}
	return jStrV(s), nil
}

func jfTrim(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("trim", []string{"chars"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	s := jSoftStr(v)
	if c := jOr(a[0], jvNone); c.k != jkNone {
		cs, err := jWantStr("trim", c)
		if err != nil {
			return jv{}, err
		}
		return jStrV(strings.Trim(s, cs)), nil
	}
	return jStrV(jPyStrip(s)), nil
}

func jfTruncate(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("truncate", []string{"length", "killwords", "end", "leeway"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	s := jSoftStr(v)
	length := 255
	if a[0].k != jkMissing {
		if length, err = jWantInt("truncate", a[0]); err != nil {
			return jv{}, err
		}
	}
	end := "..."
	if a[2].k != jkMissing {
		end = jSoftStr(a[2])
	}
	leeway := 5
	if a[3].k != jkMissing && a[3].k != jkNone {
		if leeway, err = jWantInt("truncate", a[3]); err != nil {
			return jv{}, err
		}
	}
	endLen := jStrLen(end)
	if length < endLen {
		return jv{}, jErrorf("AssertionError", "expected length >= %d, got %d", endLen, length)
	}
	if leeway < 0 {
		return jv{}, jErrorf("AssertionError", "expected leeway >= 0, got %d", leeway)
	}
	r := []rune(s)
	if len(r) <= length+leeway {
		return jStrV(s), nil
	}
	cut := string(r[:length-endLen])
	if jTruthy(jOr(a[1], jvFalse)) {
		return jStrV(cut + end), nil
	}
	if i := strings.LastIndexByte(cut, ' '); i >= 0 {
		cut = cut[:i]
	} else {
		cut = ""
	}
	return jStrV(cut + end), nil
}

func jfWordcount(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	n := 0
	in := false
	for _, r := range jSoftStr(v) {
		w := unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || unicode.Is(unicode.Mn, r) || unicode.IsNumber(r)
		if w && !in {
			n++
		}
		in = w
	}
	return jIntV(int64(n)), nil
}
