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

func jUpperStr(s string) string {
	if jIsASCII(s) {
		return strings.ToUpper(s)
	}
	return cases.Upper(language.Und).String(s)
}

func jLowerStr(s string) string {
	if jIsASCII(s) {
		return strings.ToLower(s)
	}
	return cases.Lower(language.Und).String(s)
}

func jIsCased(r rune) bool {
	return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
}

func jCapitalizeStr(s string) string {
	if s == "" {
		return s
	}
	r, size := utf8.DecodeRuneInString(s)
	first := string(unicode.ToTitle(r))
	if r == 'ß' {
		first = "Ss"
	}
	return first + jLowerStr(s[size:])
}

// jTitleStr is Python's str.title.
func jTitleStr(s string) string {
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteString(jLowerStr(string(r)))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = jIsCased(r)
	}
	return b.String()
}

func jIsLowerStr(s string) bool {
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

func jIsUpperStr(s string) bool {
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

func jCenterStr(s string, width int, fill string) string {
	n := jStrLen(s)
	if width <= n {
		return s
	}
	marg := width - n
	left := marg/2 + (marg & width & 1)
	return strings.Repeat(fill, left) + s + strings.Repeat(fill, marg-left)
}

// ---- str methods ----

func jsArgs(name string, args []jv, kw jKw, min, max int) error {
	if len(kw.names) > 0 {
		return jErrorf("TypeError", "str.%s() takes no keyword arguments", name)
	}
	if len(args) < min || len(args) > max {
		return jErrorf("TypeError", "str.%s() takes from %d to %d arguments (%d given)", name, min, max, len(args))
	}
	return nil
}

func jsCapitalize(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("capitalize", args, kw, 0, 0); err != nil {
		return jv{}, err
	}
	return jStrV(jCapitalizeStr(r.s)), nil
}

func jsLower(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("lower", args, kw, 0, 0); err != nil {
		return jv{}, err
	}
	return jStrV(jLowerStr(r.s)), nil
}

func jsUpper(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("upper", args, kw, 0, 0); err != nil {
		return jv{}, err
	}
	return jStrV(jUpperStr(r.s)), nil
}

func jsTitle(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("title", args, kw, 0, 0); err != nil {
		return jv{}, err
	}
	return jStrV(jTitleStr(r.s)), nil
}

func jsSwapcase(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("swapcase", args, kw, 0, 0); err != nil {
		return jv{}, err
	}
	var b strings.Builder
	for _, c := range r.s {
		switch {
		case unicode.IsUpper(c):
			b.WriteString(jLowerStr(string(c)))
		case unicode.IsLower(c):
			b.WriteString(jUpperStr(string(c)))
		default:
			b.WriteRune(c)
		}
	}
	return jStrV(b.String()), nil
}

func jsCenter(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("center", args, kw, 1, 2); err != nil {
		return jv{}, err
	}
	w, err := jWantInt("center", args[0])
	if err != nil {
		return jv{}, err
	}
	fill := " "
	if len(args) > 1 {
		if fill, err = jWantStr("center", args[1]); err != nil {
			return jv{}, err
		}
		if jStrLen(fill) != 1 {
			return jv{}, jErrorf("TypeError", "The fill character must be exactly one character long")
		}
	}
	return jStrV(jCenterStr(r.s, w, fill)), nil
}

func jsJust(left bool) jMethodFn {
	return func(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
		if err := jsArgs("ljust", args, kw, 1, 2); err != nil {
			return jv{}, err
		}
		w, err := jWantInt("ljust", args[0])
		if err != nil {
			return jv{}, err
		}
		fill := " "
		if len(args) > 1 {
			if fill, err = jWantStr("ljust", args[1]); err != nil {
				return jv{}, err
			}
			if jStrLen(fill) != 1 {
				return jv{}, jErrorf("TypeError", "The fill character must be exactly one character long")
			}
		}
		n := jStrLen(r.s)
		if w <= n {
			return r, nil
		}
		pad := strings.Repeat(fill, w-n)
		if left {
			return jStrV(r.s + pad), nil
		}
		return jStrV(pad + r.s), nil
	}
}

func jsZfill(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("zfill", args, kw, 1, 1); err != nil {
		return jv{}, err
	}
	w, err := jWantInt("zfill", args[0])
	if err != nil {
		return jv{}, err
	}
	s := r.s
	n := jStrLen(s)
	if w <= n {
		return r, nil
	}
	sign := ""
	if s != "" && (s[0] == '+' || s[0] == '-') {
		sign, s = s[:1], s[1:]
	}
	return jStrV(sign + strings.Repeat("0", w-n) + s), nil
}

// jRuneToByte converts a code point index of s to a byte offset (clamped).
func jRuneToByte(s string, i int) int {
	if jIsASCII(s) {
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

func jByteToRune(s string, b int) int {
	if jIsASCII(s) {
		return b
	}
	return utf8.RuneCountInString(s[:b])
}

// jStrRange applies optional start/end arguments (code point indexes, Python slice
// rules) and returns the byte range.
func jStrRange(s string, args []jv) (int, int, error) {
	n := jStrLen(s)
	start, end := 0, n
	for i, a := range args {
		if a.k == jkNone {
			continue
		}
		if a.k != jkInt && a.k != jkBool {
			return 0, 0, jErrorf("TypeError", "slice indices must be integers or None or have an __index__ method")
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
	return jRuneToByte(s, start), jRuneToByte(s, end), nil
}

func jsCount(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("count", args, kw, 1, 3); err != nil {
		return jv{}, err
	}
	sub, err := jWantStr("count", args[0])
	if err != nil {
		return jv{}, err
	}
	b, e, err := jStrRange(r.s, args[1:])
	if err != nil {
		return jv{}, err
	}
	if b < 0 {
		return jIntV(0), nil
	}
	seg := r.s[b:e]
	if sub == "" {
		return jIntV(int64(jStrLen(seg) + 1)), nil
	}
	return jIntV(int64(strings.Count(seg, sub))), nil
}

func jsFind(rev, raise bool) jMethodFn {
	return func(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
		if err := jsArgs("find", args, kw, 1, 3); err != nil {
			return jv{}, err
		}
		sub, err := jWantStr("find", args[0])
		if err != nil {
			return jv{}, err
		}
		b, e, err := jStrRange(r.s, args[1:])
		if err != nil {
			return jv{}, err
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
				idx = jByteToRune(r.s, b+i)
			}
		}
		if idx < 0 && raise {
			return jv{}, jErrorf("ValueError", "substring not found")
		}
		return jIntV(int64(idx)), nil
	}
}

func jsAffixTest(name string, r jv, args []jv, kw jKw, suffix bool) (jv, error) {
	if err := jsArgs(name, args, kw, 1, 3); err != nil {
		return jv{}, err
	}
	var cands []string
	switch a := args[0]; a.k {
	case jkStr:
		cands = []string{a.s}
	case jkTuple:
		for _, it := range a.list().items {
			if it.k != jkStr {
				return jv{}, jErrorf("TypeError", "tuple for %s must only contain str, not %s", name, jValueTypeName(it))
			}
			cands = append(cands, it.s)
		}
	default:
		return jv{}, jErrorf("TypeError", "%s first arg must be str or a tuple of str, not %s", name, jValueTypeName(a))
	}
	b, e, err := jStrRange(r.s, args[1:])
	if err != nil {
		return jv{}, err
	}
	if b < 0 {
		return jvFalse, nil
	}
	seg := r.s[b:e]
	for _, c := range cands {
		if (suffix && strings.HasSuffix(seg, c)) || (!suffix && strings.HasPrefix(seg, c)) {
			return jvTrue, nil
		}
	}
	return jvFalse, nil
}

func jsStartswith(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	return jsAffixTest("startswith", r, args, kw, false)
}

func jsEndswith(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	return jsAffixTest("endswith", r, args, kw, true)
}

func jsExpandtabs(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	size := 8
	if len(args) > 0 {
		n, err := jWantInt("expandtabs", args[0])
		if err != nil {
			return jv{}, err
		}
		size = n
	} else if v, ok := kw.get("tabsize"); ok {
		n, err := jWantInt("expandtabs", v)
		if err != nil {
			return jv{}, err
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
	return jStrV(b.String()), nil
}

func jsIsPred(pred func(rune) bool) jMethodFn {
	return func(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
		if err := jsArgs("is", args, kw, 0, 0); err != nil {
			return jv{}, err
		}
		if r.s == "" {
			return jvFalse, nil
		}
		for _, c := range r.s {
			if !pred(c) {
				return jvFalse, nil
			}
		}
		return jvTrue, nil
	}
}

func jsIsASCII(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) { return jBoolV(jIsASCII(r.s)), nil }
func jsIsLower(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) { return jBoolV(jIsLowerStr(r.s)), nil }
func jsIsUpper(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) { return jBoolV(jIsUpperStr(r.s)), nil }

func jsIsTitle(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) {
	cased, prevCased := false, false
	for _, c := range r.s {
		switch {
		case unicode.IsUpper(c) || unicode.IsTitle(c):
			if prevCased {
				return jvFalse, nil
			}
			prevCased, cased = true, true
		case unicode.IsLower(c):
			if !prevCased {
				return jvFalse, nil
			}
			prevCased, cased = true, true
		default:
			prevCased = false
		}
	}
	return jBoolV(cased), nil
}

func jsJoin(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("join", args, kw, 1, 1); err != nil {
		return jv{}, err
	}
	items, err := jIterate(args[0])
	if err != nil {
		return jv{}, jErrorf("TypeError", "can only join an iterable")
	}
	var b strings.Builder
	for i, it := range items {
		if it.k != jkStr {
			return jv{}, jErrorf("TypeError", "sequence item %d: expected str instance, %s found", i, jValueTypeName(it))
		}
		if i > 0 {
			b.WriteString(r.s)
		}
		b.WriteString(it.s)
	}
	return jStrV(b.String()), nil
}

func jsStrip(left, right bool) jMethodFn {
	return func(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
		if err := jsArgs("strip", args, kw, 0, 1); err != nil {
			return jv{}, err
		}
		s := r.s
		if len(args) == 0 || args[0].k == jkNone {
			switch {
			case left && right:
				return jStrV(jPyStrip(s)), nil
			case left:
				return jStrV(jPyLStrip(s)), nil
			}
			return jStrV(jPyRStrip(s)), nil
		}
		chars, err := jWantStr("strip", args[0])
		if err != nil {
			return jv{}, err
		}
		if left {
			s = strings.TrimLeft(s, chars)
		}
		if right {
			s = strings.TrimRight(s, chars)
		}
		return jStrV(s), nil
	}
}

func jsPartition(rev bool) jMethodFn {
	return func(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
		if err := jsArgs("partition", args, kw, 1, 1); err != nil {
			return jv{}, err
		}
		sep, err := jWantStr("partition", args[0])
		if err != nil {
			return jv{}, err
		}
		if sep == "" {
			return jv{}, jErrorf("ValueError", "empty separator")
		}
		var i int
		if rev {
			i = strings.LastIndex(r.s, sep)
		} else {
			i = strings.Index(r.s, sep)
		}
		if i < 0 {
			if rev {
				return jTupleV([]jv{jvEmptyStr, jvEmptyStr, r}), nil
			}
			return jTupleV([]jv{r, jvEmptyStr, jvEmptyStr}), nil
		}
		return jTupleV([]jv{jStrV(r.s[:i]), jStrV(sep), jStrV(r.s[i+len(sep):])}), nil
	}
}

func jsRemovePrefix(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("removeprefix", args, kw, 1, 1); err != nil {
		return jv{}, err
	}
	p, err := jWantStr("removeprefix", args[0])
	if err != nil {
		return jv{}, err
	}
	return jStrV(strings.TrimPrefix(r.s, p)), nil
}

func jsRemoveSuffix(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if err := jsArgs("removesuffix", args, kw, 1, 1); err != nil {
		return jv{}, err
	}
	p, err := jWantStr("removesuffix", args[0])
	if err != nil {
		return jv{}, err
	}
	return jStrV(strings.TrimSuffix(r.s, p)), nil
}

func jsReplace(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("replace", []string{"old", "new", "count"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if a[0].k == jkMissing || a[1].k == jkMissing {
		return jv{}, jErrorf("TypeError", "replace expected at least 2 arguments, got %d", len(args))
	}
	old, err := jWantStr("replace", a[0])
	if err != nil {
		return jv{}, err
	}
	repl, err := jWantStr("replace", a[1])
	if err != nil {
		return jv{}, err
	}
	n := -1
	if a[2].k != jkMissing {
		if n, err = jWantInt("replace", a[2]); err != nil {
			return jv{}, err
		}
	}
	return jStrV(jPyReplace(r.s, old, repl, n)), nil
}

// jsSplit is str.split / str.rsplit.
func jsSplit(rev bool) jMethodFn {
	return func(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
		a, err := jBind("split", []string{"sep", "maxsplit"}, args, kw)
		if err != nil {
			return jv{}, err
		}
		maxsplit := -1
		if a[1].k != jkMissing {
			if maxsplit, err = jWantInt("split", a[1]); err != nil {
				return jv{}, err
			}
		}
		var parts []string
		if sep := jOr(a[0], jvNone); sep.k == jkNone {
			parts = jSplitWhitespace(r.s, maxsplit, rev)
		} else {
			s, err := jWantStr("split", sep)
			if err != nil {
				return jv{}, err
			}
			if s == "" {
				return jv{}, jErrorf("ValueError", "empty separator")
			}
			if maxsplit < 0 {
				parts = strings.Split(r.s, s)
			} else if !rev {
				parts = strings.SplitN(r.s, s, maxsplit+1)
			} else {
				parts = jRSplitN(r.s, s, maxsplit)
			}
		}
		out := make([]jv, len(parts))
		for i, p := range parts {
			out[i] = jStrV(p)
		}
		return jListV(out), nil
	}
}

func jRSplitN(s, sep string, maxsplit int) []string {
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

func jSplitWhitespace(s string, maxsplit int, rev bool) []string {
	type span struct{ a, b int }
	var words []span
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if jPyIsSpace(r) {
			i += size
			continue
		}
		j := i
		for j < len(s) {
			r2, s2 := utf8.DecodeRuneInString(s[j:])
			if jPyIsSpace(r2) {
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

func jsSplitlines(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("splitlines", []string{"keepends"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	lines := jSplitlines(r.s, jTruthy(jOr(a[0], jvFalse)))
	out := make([]jv, len(lines))
	for i, l := range lines {
		out[i] = jStrV(l)
	}
	return jListV(out), nil
}

func jsFormat(e *jEval, r jv, args []jv, kw jKw) (jv, error) {
	s, err := jStrFormat(e, r.s, args, kw)
	if err != nil {
		return jv{}, err
	}
	return jStrV(s), nil
}

func jsFormatMap(e *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) != 1 || args[0].k != jkDict {
		return jv{}, jErrorf("TypeError", "format_map() takes exactly one mapping argument")
	}
	d := args[0].dict()
	var m jKw
	for i, k := range d.keys {
		if k.k == jkStr {
			m.names = append(m.names, k.s)
			m.vals = append(m.vals, d.vals[i])
		}
	}
	return jsFormat(e, r, nil, m)
}
