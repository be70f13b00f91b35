package jinja

// Methods of str (CPython's semantics, by code point) and Python's full Unicode case
// mapping.

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

func pyUpper(s string) string {
	if isASCII(s) {
		return strings.ToUpper(s)
	}
	return cases.Upper(language.Und).String(s)
}

func pyLower(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	return cases.Lower(language.Und).String(s)
}

func isCased(r rune) bool {
	return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
}

func pyCapitalize(s string) string {
	if s == "" {
		return s
	}
	r, size := utf8.DecodeRuneInString(s)
	first := string(unicode.ToTitle(r))
	if r == 'ß' {
		first = "Ss"
	}
	return first + pyLower(s[size:])
}

// pyTitle is Python's str.title.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteString(pyLower(string(r)))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = isCased(r)
	}
	return b.String()
}

func pyIsLower(s string) bool {
	cased := false
	for _, r := range s {
		if unicode.IsUpper(r) || unicode.IsTitle(r) {
			return false
		}
		if unicode.IsLower(r) {
			cased = true
		}
	}
	return cased
}

func pyIsUpper(s string) bool {
	cased := false
	for _, r := range s {
		if unicode.IsLower(r) || unicode.IsTitle(r) {
			return false
		}
		if unicode.IsUpper(r) {
			cased = true
		}
	}
	return cased
}

func pyCenter(s string, width int, fill string) string {
	n := strLen(s)
	if width <= n {
		return s
	}
	marg := width - n
	left := marg/2 + (marg & width & 1)
	return strings.Repeat(fill, left) + s + strings.Repeat(fill, marg-left)
}

// ---- str methods ----

func strArgs(name string, args []Value, kw kwargs, min, max int) error {
	if len(kw.names) > 0 {
		return errorf("TypeError", "str.%s() takes no keyword arguments", name)
	}
	if len(args) < min || len(args) > max {
		return errorf("TypeError", "str.%s() takes from %d to %d arguments (%d given)", name, min, max, len(args))
	}
	return nil
}

func strCapitalize(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("capitalize", args, kw, 0, 0); err != nil {
		return Value{}, err
	}
	return StringValue(pyCapitalize(r.s)), nil
}

func strLower(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("lower", args, kw, 0, 0); err != nil {
		return Value{}, err
	}
	return StringValue(pyLower(r.s)), nil
}

func strUpper(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("upper", args, kw, 0, 0); err != nil {
		return Value{}, err
	}
	return StringValue(pyUpper(r.s)), nil
}

func strTitle(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("title", args, kw, 0, 0); err != nil {
		return Value{}, err
	}
	return StringValue(pyTitle(r.s)), nil
}

func strSwapcase(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("swapcase", args, kw, 0, 0); err != nil {
		return Value{}, err
	}
	var b strings.Builder
	for _, c := range r.s {
		switch {
		case unicode.IsUpper(c):
			b.WriteString(pyLower(string(c)))
		case unicode.IsLower(c):
			b.WriteString(pyUpper(string(c)))
		default:
			b.WriteRune(c)
		}
	}
	return StringValue(b.String()), nil
}

func strCenter(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("center", args, kw, 1, 2); err != nil {
		return Value{}, err
	}
	w, err := wantInt("center", args[0])
	if err != nil {
		return Value{}, err
	}
	fill := " "
	if len(args) > 1 {
		if fill, err = wantStr("center", args[1]); err != nil {
			return Value{}, err
		}
		if strLen(fill) != 1 {
			return Value{}, errorf("TypeError", "The fill character must be exactly one character long")
		}
	}
	return StringValue(pyCenter(r.s, w, fill)), nil
}

func strJust(left bool) methodFunc {
	return func(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
		if err := strArgs("ljust", args, kw, 1, 2); err != nil {
			return Value{}, err
		}
		w, err := wantInt("ljust", args[0])
		if err != nil {
			return Value{}, err
		}
		fill := " "
		if len(args) > 1 {
			if fill, err = wantStr("ljust", args[1]); err != nil {
				return Value{}, err
			}
			if strLen(fill) != 1 {
				return Value{}, errorf("TypeError", "The fill character must be exactly one character long")
			}
		}
		n := strLen(r.s)
		if w <= n {
			return r, nil
		}
		pad := strings.Repeat(fill, w-n)
		if left {
			return StringValue(r.s + pad), nil
		}
		return StringValue(pad + r.s), nil
	}
}

func strZfill(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("zfill", args, kw, 1, 1); err != nil {
		return Value{}, err
	}
	w, err := wantInt("zfill", args[0])
	if err != nil {
		return Value{}, err
	}
	s := r.s
	n := strLen(s)
	if w <= n {
		return r, nil
	}
	sign := ""
	if s != "" && (s[0] == '+' || s[0] == '-') {
		sign, s = s[:1], s[1:]
	}
	return StringValue(sign + strings.Repeat("0", w-n) + s), nil
}

// runeToByte converts a code point index of s to a byte offset (clamped).
func runeToByte(s string, i int) int {
	if isASCII(s) {
		if i > len(s) {
			return len(s)
		}
		return i
	}
	n := 0
	for pos := range s {
		if n == i {
			return pos
		}
		n++
	}
	return len(s)
}

func byteToRune(s string, b int) int {
	if isASCII(s) {
		return b
	}
	return utf8.RuneCountInString(s[:b])
}

// strRange applies optional start/end arguments (code point indexes, Python slice
// rules) and returns the byte range.
func strRange(s string, args []Value) (int, int, error) {
	n := strLen(s)
	start, end := 0, n
	for i, a := range args {
		if a.k == KindNone {
			continue
		}
		if a.k != KindInt && a.k != KindBool {
			return 0, 0, errorf("TypeError", "slice indices must be integers or None or have an __index__ method")
		}
		v := int(a.n)
		if v < 0 {
			v += n
			if v < 0 {
				v = 0
			}
		}
		if v > n {
			v = n
		}
		if i == 0 {
			start = v
		} else {
			end = v
		}
	}
	if end < start {
		return -1, -1, nil
	}
	return runeToByte(s, start), runeToByte(s, end), nil
}

func strCount(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("count", args, kw, 1, 3); err != nil {
		return Value{}, err
	}
	sub, err := wantStr("count", args[0])
	if err != nil {
		return Value{}, err
	}
	b, e, err := strRange(r.s, args[1:])
	if err != nil {
		return Value{}, err
	}
	if b < 0 {
		return intValue(0), nil
	}
	seg := r.s[b:e]
	if sub == "" {
		return intValue(int64(strLen(seg) + 1)), nil
	}
	return intValue(int64(strings.Count(seg, sub))), nil
}

func strFind(rev, raise bool) methodFunc {
	return func(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
		if err := strArgs("find", args, kw, 1, 3); err != nil {
			return Value{}, err
		}
		sub, err := wantStr("find", args[0])
		if err != nil {
			return Value{}, err
		}
		b, e, err := strRange(r.s, args[1:])
		if err != nil {
			return Value{}, err
		}
		idx := -1
		if b >= 0 {
			seg := r.s[b:e]
			var i int
			if rev {
				i = strings.LastIndex(seg, sub)
			} else {
				i = strings.Index(seg, sub)
			}
			if i >= 0 {
				idx = byteToRune(r.s, b+i)
			}
		}
		if idx < 0 && raise {
			return Value{}, errorf("ValueError", "substring not found")
		}
		return intValue(int64(idx)), nil
	}
}

func strAffixTest(name string, r Value, args []Value, kw kwargs, suffix bool) (Value, error) {
	if err := strArgs(name, args, kw, 1, 3); err != nil {
		return Value{}, err
	}
	var cands []string
	switch a := args[0]; a.k {
	case KindString:
		cands = []string{a.s}
	case kindTuple:
		for _, it := range a.list().items {
			if it.k != KindString {
				return Value{}, errorf("TypeError", "tuple for %s must only contain str, not %s", name, it.TypeName())
			}
			cands = append(cands, it.s)
		}
	default:
		return Value{}, errorf("TypeError", "%s first arg must be str or a tuple of str, not %s", name, a.TypeName())
	}
	b, e, err := strRange(r.s, args[1:])
	if err != nil {
		return Value{}, err
	}
	if b < 0 {
		return falseValue, nil
	}
	seg := r.s[b:e]
	for _, c := range cands {
		if (suffix && strings.HasSuffix(seg, c)) || (!suffix && strings.HasPrefix(seg, c)) {
			return trueValue, nil
		}
	}
	return falseValue, nil
}

func strStartswith(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	return strAffixTest("startswith", r, args, kw, false)
}

func strEndswith(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	return strAffixTest("endswith", r, args, kw, true)
}

func strExpandtabs(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	size := 8
	if len(args) > 0 {
		n, err := wantInt("expandtabs", args[0])
		if err != nil {
			return Value{}, err
		}
		size = n
	} else if v, ok := kw.get("tabsize"); ok {
		n, err := wantInt("expandtabs", v)
		if err != nil {
			return Value{}, err
		}
		size = n
	}
	var b strings.Builder
	col := 0
	for _, c := range r.s {
		switch c {
		case '\t':
			if size > 0 {
				sp := size - col%size
				b.WriteString(strings.Repeat(" ", sp))
				col += sp
			}
		case '\n', '\r':
			b.WriteRune(c)
			col = 0
		default:
			b.WriteRune(c)
			col++
		}
	}
	return StringValue(b.String()), nil
}

func strIsPred(pred func(rune) bool) methodFunc {
	return func(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
		if err := strArgs("is", args, kw, 0, 0); err != nil {
			return Value{}, err
		}
		if r.s == "" {
			return falseValue, nil
		}
		for _, c := range r.s {
			if !pred(c) {
				return falseValue, nil
			}
		}
		return trueValue, nil
	}
}

func strIsASCII(_ *evaluator, r Value, _ []Value, _ kwargs) (Value, error) {
	return BoolValue(isASCII(r.s)), nil
}
func strIsLower(_ *evaluator, r Value, _ []Value, _ kwargs) (Value, error) {
	return BoolValue(pyIsLower(r.s)), nil
}
func strIsUpper(_ *evaluator, r Value, _ []Value, _ kwargs) (Value, error) {
	return BoolValue(pyIsUpper(r.s)), nil
}

func strIsTitle(_ *evaluator, r Value, _ []Value, _ kwargs) (Value, error) {
	cased, prevCased := false, false
	for _, c := range r.s {
		switch {
		case unicode.IsUpper(c) || unicode.IsTitle(c):
			if prevCased {
				return falseValue, nil
			}
			prevCased, cased = true, true
		case unicode.IsLower(c):
			if !prevCased {
				return falseValue, nil
			}
			prevCased, cased = true, true
		default:
			prevCased = false
		}
	}
	return BoolValue(cased), nil
}

func strJoin(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("join", args, kw, 1, 1); err != nil {
		return Value{}, err
	}
	items, err := iterate(args[0])
	if err != nil {
		return Value{}, errorf("TypeError", "can only join an iterable")
	}
	var b strings.Builder
	for i, it := range items {
		if it.k != KindString {
			return Value{}, errorf("TypeError", "sequence item %d: expected str instance, %s found", i, it.TypeName())
		}
		if i > 0 {
			b.WriteString(r.s)
		}
		b.WriteString(it.s)
	}
	return StringValue(b.String()), nil
}

func strStrip(left, right bool) methodFunc {
	return func(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
		if err := strArgs("strip", args, kw, 0, 1); err != nil {
			return Value{}, err
		}
		s := r.s
		if len(args) == 0 || args[0].k == KindNone {
			switch {
			case left && right:
				return StringValue(pyStrip(s)), nil
			case left:
				return StringValue(pyLStrip(s)), nil
			}
			return StringValue(pyRStrip(s)), nil
		}
		chars, err := wantStr("strip", args[0])
		if err != nil {
			return Value{}, err
		}
		if left {
			s = strings.TrimLeft(s, chars)
		}
		if right {
			s = strings.TrimRight(s, chars)
		}
		return StringValue(s), nil
	}
}

func strPartition(rev bool) methodFunc {
	return func(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
		if err := strArgs("partition", args, kw, 1, 1); err != nil {
			return Value{}, err
		}
		sep, err := wantStr("partition", args[0])
		if err != nil {
			return Value{}, err
		}
		if sep == "" {
			return Value{}, errorf("ValueError", "empty separator")
		}
		var i int
		if rev {
			i = strings.LastIndex(r.s, sep)
		} else {
			i = strings.Index(r.s, sep)
		}
		if i < 0 {
			if rev {
				return tupleValue([]Value{emptyString, emptyString, r}), nil
			}
			return tupleValue([]Value{r, emptyString, emptyString}), nil
		}
		return tupleValue([]Value{StringValue(r.s[:i]), StringValue(sep), StringValue(r.s[i+len(sep):])}), nil
	}
}

func strRemovePrefix(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("removeprefix", args, kw, 1, 1); err != nil {
		return Value{}, err
	}
	p, err := wantStr("removeprefix", args[0])
	if err != nil {
		return Value{}, err
	}
	return StringValue(strings.TrimPrefix(r.s, p)), nil
}

func strRemoveSuffix(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if err := strArgs("removesuffix", args, kw, 1, 1); err != nil {
		return Value{}, err
	}
	p, err := wantStr("removesuffix", args[0])
	if err != nil {
		return Value{}, err
	}
	return StringValue(strings.TrimSuffix(r.s, p)), nil
}

func strReplace(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("replace", []string{"old", "new", "count"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	if a[0].k == kindMissing || a[1].k == kindMissing {
		return Value{}, errorf("TypeError", "replace expected at least 2 arguments, got %d", len(args))
	}
	old, err := wantStr("replace", a[0])
	if err != nil {
		return Value{}, err
	}
	repl, err := wantStr("replace", a[1])
	if err != nil {
		return Value{}, err
	}
	n := -1
	if a[2].k != kindMissing {
		if n, err = wantInt("replace", a[2]); err != nil {
			return Value{}, err
		}
	}
	return StringValue(pyReplace(r.s, old, repl, n)), nil
}

// strSplit is str.split / str.rsplit.
func strSplit(rev bool) methodFunc {
	return func(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
		a, err := bind("split", []string{"sep", "maxsplit"}, args, kw)
		if err != nil {
			return Value{}, err
		}
		maxsplit := -1
		if a[1].k != kindMissing {
			if maxsplit, err = wantInt("split", a[1]); err != nil {
				return Value{}, err
			}
		}
		var parts []string
		if sep := orDefault(a[0], noneValue); sep.k == KindNone {
			parts = splitWhitespace(r.s, maxsplit, rev)
		} else {
			s, err := wantStr("split", sep)
			if err != nil {
				return Value{}, err
			}
			if s == "" {
				return Value{}, errorf("ValueError", "empty separator")
			}
			if maxsplit < 0 {
				parts = strings.Split(r.s, s)
			} else if !rev {
				parts = strings.SplitN(r.s, s, maxsplit+1)
			} else {
				parts = rsplitN(r.s, s, maxsplit)
			}
		}
		out := make([]Value, len(parts))
		for i, p := range parts {
			out[i] = StringValue(p)
		}
		return ListValue(out), nil
	}
}

func rsplitN(s, sep string, maxsplit int) []string {
	var rev []string
	for maxsplit > 0 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
		maxsplit--
	}
	out := []string{s}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

func splitWhitespace(s string, maxsplit int, rev bool) []string {
	type span struct{ a, b int }
	var words []span
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if pyIsSpace(r) {
			i += size
			continue
		}
		j := i
		for j < len(s) {
			r2, s2 := utf8.DecodeRuneInString(s[j:])
			if pyIsSpace(r2) {
				break
			}
			j += s2
		}
		words = append(words, span{i, j})
		i = j
	}
	if maxsplit < 0 || maxsplit >= len(words)-1 || len(words) == 0 {
		out := make([]string, len(words))
		for k, w := range words {
			out[k] = s[w.a:w.b]
		}
		return out
	}
	var out []string
	if !rev {
		for k := 0; k < maxsplit; k++ {
			out = append(out, s[words[k].a:words[k].b])
		}
		out = append(out, s[words[maxsplit].a:])
		return out
	}
	n := len(words)
	out = append(out, s[:words[n-maxsplit-1].b])
	for k := n - maxsplit; k < n; k++ {
		out = append(out, s[words[k].a:words[k].b])
	}
	return out
}

func strSplitlines(_ *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("splitlines", []string{"keepends"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	lines := splitlines(r.s, orDefault(a[0], falseValue).Truth())
	out := make([]Value, len(lines))
	for i, l := range lines {
		out[i] = StringValue(l)
	}
	return ListValue(out), nil
}

func strFormat(e *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	s, err := vformat(e, r.s, args, kw)
	if err != nil {
		return Value{}, err
	}
	return StringValue(s), nil
}

func strFormatMap(e *evaluator, r Value, args []Value, kw kwargs) (Value, error) {
	if len(args) != 1 || args[0].k != KindDict {
		return Value{}, errorf("TypeError", "format_map() takes exactly one mapping argument")
	}
	d := args[0].dict()
	var m kwargs
	for i, k := range d.keys {
		if k.k == KindString {
			m.names = append(m.names, k.s)
			m.vals = append(m.vals, d.vals[i])
		}
	}
	return strFormat(e, r, nil, m)
}
