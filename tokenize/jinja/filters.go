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

func filterAbs(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	if _, err := bind("abs", nil, args, kw); err != nil {
		return Value{}, err
	}
	switch v.k {
	case KindInt, KindBool:
		if v.n < 0 {
			return negate(v)
		}
		return intValue(v.n), nil
	case kindBig:
		return bigValue(new(big.Int).Abs(v.o.(*big.Int))), nil
	case KindFloat:
		return floatValue(math.Abs(v.f)), nil
	case KindUndefined:
		return Value{}, undefinedError(v)
	}
	return Value{}, errorf("TypeError", "bad operand type for abs(): '%s'", v.TypeName())
}

func filterCapitalize(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	return StringValue(pyCapitalize(softStr(v))), nil
}

func filterCenter(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("center", []string{"width"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	w := 80
	if a[0].k != kindMissing {
		if w, err = wantInt("center", a[0]); err != nil {
			return Value{}, err
		}
	}
	return StringValue(pyCenter(softStr(v), w, " ")), nil
}

func filterDefault(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("default", []string{"default_value", "boolean"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	def := orDefault(a[0], emptyString)
	if v.k == KindUndefined || (orDefault(a[1], falseValue).Truth() && !v.Truth()) {
		return def, nil
	}
	return v, nil
}

func htmlEscape(s string) string {
	if !strings.ContainsAny(s, "&<>'\"") {
		return s
	}
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&#39;", "\"", "&#34;")
	return r.Replace(s)
}

func filterEscape(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	return StringValue(htmlEscape(softStr(v))), nil
}

// pyFloatFromString is Python's float(str).
func pyFloatFromString(s string) (float64, bool) {
	t := strings.ReplaceAll(pyStrip(s), "_", "")
	if strings.Contains(pyStrip(s), "__") || strings.HasPrefix(pyStrip(s), "_") || strings.HasSuffix(pyStrip(s), "_") {
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
	f, err := parseFloat(t)
	if err != nil {
		return 0, false
	}
	return f, true
}

func filterFloat(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("float", []string{"default"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	def := orDefault(a[0], floatValue(0))
	switch v.k {
	case KindFloat:
		return v, nil
	case KindInt, KindBool, kindBig:
		f, err := asFloat(v)
		if err != nil {
			return Value{}, err
		}
		return floatValue(f), nil
	case KindString:
		if f, ok := pyFloatFromString(v.s); ok {
			return floatValue(f), nil
		}
	case KindUndefined:
		return Value{}, undefinedError(v)
	}
	return def, nil
}

func filterFormat(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	if len(args) > 0 && len(kw.names) > 0 {
		return Value{}, errorf("FilterArgumentError", "can't handle positional and keyword arguments at the same time")
	}
	var arg Value
	if len(kw.names) > 0 {
		d := NewDict(len(kw.names))
		for i, n := range kw.names {
			d.set(StringValue(n), kw.vals[i])
		}
		arg = DictValue(d)
	} else {
		arg = tupleValue(args)
	}
	s, err := percentFormat(softStr(v), arg)
	if err != nil {
		return Value{}, err
	}
	return StringValue(s), nil
}

// splitlines is Python's str.splitlines(keepends).
func splitlines(s string, keepends bool) []string {
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

func filterIndent(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("indent", []string{"width", "first", "blank"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	indention := "    "
	switch w := a[0]; w.k {
	case kindMissing:
	case KindString:
		indention = w.s
	default:
		n, err := wantInt("indent", w)
		if err != nil {
			return Value{}, err
		}
		if n < 0 {
			n = 0
		}
		indention = strings.Repeat(" ", n)
	}
	s := softStr(v) + "\n"
	lines := splitlines(s, false)
	var rv string
	if orDefault(a[2], falseValue).Truth() {
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
	if orDefault(a[1], falseValue).Truth() {
		rv = indention + rv
	}
	return StringValue(rv), nil
}

// pyIntFromString is Python's int(str, base).
func pyIntFromString(s string, base int) (Value, bool) {
	t := pyStrip(s)
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
				return Value{}, false
			}
		}
	}
	if t == "" || strings.HasPrefix(t, "_") || strings.HasSuffix(t, "_") || strings.Contains(t, "__") {
		return Value{}, false
	}
	t = strings.ReplaceAll(t, "_", "")
	if base < 2 || base > 36 {
		return Value{}, false
	}
	b, ok := new(big.Int).SetString(t, base)
	if !ok {
		return Value{}, false
	}
	if neg {
		b.Neg(b)
	}
	return bigValue(b), true
}

func filterInt(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("int", []string{"default", "base"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	def := orDefault(a[0], intValue(0))
	base := 10
	if a[1].k != kindMissing {
		if base, err = wantInt("int", a[1]); err != nil {
			return Value{}, err
		}
	}
	switch v.k {
	case KindInt, kindBig:
		return v, nil
	case KindBool:
		return intValue(v.n), nil
	case KindFloat:
		if math.IsInf(v.f, 0) {
			return Value{}, errorf("OverflowError", "cannot convert float infinity to integer")
		}
		if math.IsNaN(v.f) {
			return def, nil
		}
		b, _ := new(big.Float).SetFloat64(math.Trunc(v.f)).Int(nil)
		return bigValue(b), nil
	case KindString:
		if r, ok := pyIntFromString(v.s, base); ok {
			return r, nil
		}
		if f, ok := pyFloatFromString(v.s); ok {
			if math.IsInf(f, 0) {
				return Value{}, errorf("OverflowError", "cannot convert float infinity to integer")
			}
			if math.IsNaN(f) {
				return def, nil
			}
			b, _ := new(big.Float).SetFloat64(math.Trunc(f)).Int(nil)
			return bigValue(b), nil
		}
	case KindUndefined:
		return Value{}, undefinedError(v)
	}
	return def, nil
}

func filterLower(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	return StringValue(pyLower(softStr(v))), nil
}

func filterUpper(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	return StringValue(pyUpper(softStr(v))), nil
}

func filterPprint(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	return StringValue(v.Repr()), nil
}

func filterReplace(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("replace", []string{"old", "new", "count"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	if a[0].k == kindMissing || a[1].k == kindMissing {
		return Value{}, errorf("TypeError", "do_replace() missing required arguments")
	}
	n := -1
	if a[2].k != kindMissing && a[2].k != KindNone {
		if n, err = wantInt("replace", a[2]); err != nil {
			return Value{}, err
		}
	}
	return StringValue(pyReplace(softStr(v), softStr(a[0]), softStr(a[1]), n)), nil
}

func pyReplace(s, old, repl string, n int) string {
	if n < 0 {
		n = -1
	}
	return strings.Replace(s, old, repl, n)
}

func filterRound(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("round", []string{"precision", "method"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	prec := 0
	if a[0].k != kindMissing {
		if prec, err = wantInt("round", a[0]); err != nil {
			return Value{}, err
		}
	}
	method := "common"
	if a[1].k != kindMissing {
		if method, err = wantStr("round", a[1]); err != nil {
			return Value{}, err
		}
	}
	if method != "common" && method != "ceil" && method != "floor" {
		return Value{}, errorf("FilterArgumentError", "method must be common, ceil or floor")
	}
	if !v.isNumber() {
		if v.k == KindUndefined {
			return Value{}, undefinedError(v)
		}
		return Value{}, errorf("TypeError", "type %s doesn't define __round__ method", v.TypeName())
	}
	if method == "common" {
		if v.k != KindFloat {
			if prec >= 0 {
				return unaryPlus(v)
			}
			f, _ := asFloat(v)
			p := math.Pow(10, float64(-prec))
			r := math.RoundToEven(f/p) * p
			b, _ := new(big.Float).SetFloat64(r).Int(nil)
			return bigValue(b), nil
		}
		return floatValue(pyRound(v.f, prec)), nil
	}
	f, err := asFloat(v)
	if err != nil {
		return Value{}, err
	}
	p := math.Pow(10, float64(prec))
	if method == "ceil" {
		return floatValue(math.Ceil(f*p) / p), nil
	}
	return floatValue(math.Floor(f*p) / p), nil
}

// pyRound is Python's round(float, ndigits): correctly rounded, ties to even.
func pyRound(f float64, nd int) float64 {
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

func filterSafe(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) { return v, nil }

func filterString(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	return StringValue(softStr(v)), nil
}

// filterTitle is jinja2's do_title: capitalise after runs of "-", whitespace, "(", "{",
// "[" and "<" (not str.title).
func filterTitle(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	s := softStr(v)
	var b strings.Builder
	isSep := func(r rune) bool {
		return r == '-' || r == '(' || r == '{' || r == '[' || r == '<' || pyIsSpace(r)
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
		b.WriteString(pyUpper(word[:fs]))
		b.WriteString(pyLower(word[fs:]))
		i = j
	}
	return StringValue(b.String()), nil
}

func filterToJSON(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("tojson", []string{"ensure_ascii", "indent", "separators", "sort_keys"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	opt := dumpOptions{itemSep: ", ", keySep: ": "}
	opt.ensureASCII = orDefault(a[0], falseValue).Truth()
	switch ind := orDefault(a[1], noneValue); ind.k {
	case KindNone:
	case KindString:
		s := ind.s
		opt.indent = &s
	case KindInt, KindBool:
		n := int(ind.n)
		if n < 0 {
			n = 0
		}
		if n > 1000 {
			return Value{}, errorf("ValueError", "indent too large")
		}
		s := strings.Repeat(" ", n)
		opt.indent = &s
	default:
		return Value{}, errorf("TypeError", "indent must be an int or a str, not %s", ind.TypeName())
	}
	if opt.indent != nil {
		opt.itemSep = ","
	}
	if sep := orDefault(a[2], noneValue); sep.k != KindNone {
		items, err := iterate(sep)
		if err != nil || len(items) != 2 || items[0].k != KindString || items[1].k != KindString {
			return Value{}, errorf("ValueError", "separators must be a (item_separator, key_separator) pair of strings")
		}
		opt.itemSep, opt.keySep = items[0].s, items[1].s
	}
	opt.sortKeys = orDefault(a[3], falseValue).Truth()
	s, err := dumpJSON(v, &opt)
	if err != nil {
		return Value{}, err
	}
	return StringValue(s), nil
}

func filterTrim(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("trim", []string{"chars"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	s := softStr(v)
	if c := orDefault(a[0], noneValue); c.k != KindNone {
		cs, err := wantStr("trim", c)
		if err != nil {
			return Value{}, err
		}
		return StringValue(strings.Trim(s, cs)), nil
	}
	return StringValue(pyStrip(s)), nil
}

func filterTruncate(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("truncate", []string{"length", "killwords", "end", "leeway"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	s := softStr(v)
	length := 255
	if a[0].k != kindMissing {
		if length, err = wantInt("truncate", a[0]); err != nil {
			return Value{}, err
		}
	}
	end := "..."
	if a[2].k != kindMissing {
		end = softStr(a[2])
	}
	leeway := 5
	if a[3].k != kindMissing && a[3].k != KindNone {
		if leeway, err = wantInt("truncate", a[3]); err != nil {
			return Value{}, err
		}
	}
	endLen := strLen(end)
	if length < endLen {
		return Value{}, errorf("AssertionError", "expected length >= %d, got %d", endLen, length)
	}
	if leeway < 0 {
		return Value{}, errorf("AssertionError", "expected leeway >= 0, got %d", leeway)
	}
	r := []rune(s)
	if len(r) <= length+leeway {
		return StringValue(s), nil
	}
	cut := string(r[:length-endLen])
	if orDefault(a[1], falseValue).Truth() {
		return StringValue(cut + end), nil
	}
	if i := strings.LastIndexByte(cut, ' '); i >= 0 {
		cut = cut[:i]
	} else {
		cut = ""
	}
	return StringValue(cut + end), nil
}

func filterWordcount(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	n := 0
	in := false
	for _, r := range softStr(v) {
		w := unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || unicode.Is(unicode.Mn, r) || unicode.IsNumber(r)
		if w && !in {
			n++
		}
		in = w
	}
	return intValue(int64(n)), nil
}
