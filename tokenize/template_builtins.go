package tokenize

// Builtins of the chat-template interpreter: jinja2's default filters and tests, the
// globals of the transformers environment (range, dict, namespace, cycler, joiner,
// raise_exception, strftime_now) and the Python methods of str, dict and list that
// templates call. Semantics follow jinja2 3.1's filters.py/tests.py and CPython.
//
// Not implemented (a template using them fails to parse, or errors when the call is
// reached inside an if): the filters filesizeformat, forceescape, random, striptags,
// urlencode, urlize, wordwrap and xmlattr, the lipsum global, and str methods that
// need Unicode tables Go lacks (isidentifier, isprintable, encode, translate, maketrans).
// Generators returned by filters (map, select, reject, selectattr, rejectattr, unique,
// batch, slice, items, reverse) and dict views are modelled (always-true, no len(),
// single pass; views print as dict_keys([...])), but computed eagerly, so an error
// inside them is raised where the filter is applied rather than where it is consumed.
// range() returns a list (Python prints "range(0, 3)").

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

type jFilterFn func(e *jEval, v jv, args []jv, kw jKw) (jv, error)
type jTestFn func(e *jEval, v jv, args []jv, kw jKw) (bool, error)

var (
	jFilters       map[string]jFilterFn
	jTests         map[string]jTestFn
	jStrMethods    map[string]jMethodFn
	jDictMethodFns map[string]jMethodFn
	jListMethodFns map[string]jMethodFn
	jGlobals       []jGlobal
)

type jGlobal struct {
	name string
	v    jv
}

func init() {
	jFilters = map[string]jFilterFn{
		"abs":        jfAbs,
		"attr":       jfAttr,
		"batch":      jfBatch,
		"capitalize": jfCapitalize,
		"center":     jfCenter,
		"count":      jfLength,
		"d":          jfDefault,
		"default":    jfDefault,
		"dictsort":   jfDictsort,
		"e":          jfEscape,
		"escape":     jfEscape,
		"first":      jfFirst,
		"float":      jfFloat,
		"format":     jfFormat,
		"groupby":    jfGroupby,
		"indent":     jfIndent,
		"int":        jfInt,
		"items":      jfItems,
		"join":       jfJoin,
		"last":       jfLast,
		"length":     jfLength,
		"list":       jfList,
		"lower":      jfLower,
		"map":        jfMap,
		"max":        jfMax,
		"min":        jfMin,
		"pprint":     jfPprint,
		"reject":     jfReject,
		"rejectattr": jfRejectattr,
		"replace":    jfReplace,
		"reverse":    jfReverse,
		"round":      jfRound,
		"safe":       jfSafe,
		"select":     jfSelect,
		"selectattr": jfSelectattr,
		"slice":      jfSlice,
		"sort":       jfSort,
		"string":     jfString,
		"sum":        jfSum,
		"title":      jfTitle,
		"tojson":     jfToJSON,
		"trim":       jfTrim,
		"truncate":   jfTruncate,
		"unique":     jfUnique,
		"upper":      jfUpper,
		"wordcount":  jfWordcount,
	}
	jTests = map[string]jTestFn{
		"boolean":     jtBoolean,
		"callable":    jtCallable,
		"defined":     func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k != jkUndef, nil },
		"divisibleby": jtDivisibleby,
		"eq":          jtCmp("=="),
		"equalto":     jtCmp("=="),
		"==":          jtCmp("=="),
		"escaped":     func(_ *jEval, _ jv, _ []jv, _ jKw) (bool, error) { return false, nil },
		"even":        jtEven,
		"false":       func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkBool && v.n == 0, nil },
		"filter":      jtFilter,
		"float":       func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkFloat, nil },
		"ge":          jtCmp(">="),
		">=":          jtCmp(">="),
		"gt":          jtCmp(">"),
		">":           jtCmp(">"),
		"greaterthan": jtCmp(">"),
		"in":          jtIn,
		"integer":     func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkInt || v.k == jkBig, nil },
		"iterable":    jtIterable,
		"le":          jtCmp("<="),
		"<=":          jtCmp("<="),
		"lower":       jtLower,
		"lt":          jtCmp("<"),
		"<":           jtCmp("<"),
		"lessthan":    jtCmp("<"),
		"mapping":     func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkDict, nil },
		"ne":          jtCmp("!="),
		"!=":          jtCmp("!="),
		"none":        func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkNone, nil },
		"number":      func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.isNumber(), nil },
		"odd":         jtOdd,
		"sameas":      jtSameas,
		"sequence":    jtSequence,
		"string":      func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkStr, nil },
		"test":        jtTest,
		"true":        func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkBool && v.n == 1, nil },
		"undefined":   func(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkUndef, nil },
		"upper":       jtUpper,
	}
	jStrMethods = map[string]jMethodFn{
		"capitalize":   jsCapitalize,
		"casefold":     jsLower,
		"center":       jsCenter,
		"count":        jsCount,
		"endswith":     jsEndswith,
		"expandtabs":   jsExpandtabs,
		"find":         jsFind(false, false),
		"format":       jsFormat,
		"format_map":   jsFormatMap,
		"index":        jsFind(false, true),
		"isalnum":      jsIsPred(func(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) }),
		"isalpha":      jsIsPred(unicode.IsLetter),
		"isascii":      jsIsASCII,
		"isdecimal":    jsIsPred(func(r rune) bool { return unicode.Is(unicode.Nd, r) }),
		"isdigit":      jsIsPred(func(r rune) bool { return unicode.Is(unicode.Nd, r) || unicode.Is(unicode.No, r) }),
		"islower":      jsIsLower,
		"isnumeric":    jsIsPred(unicode.IsNumber),
		"isspace":      jsIsPred(jPyIsSpace),
		"istitle":      jsIsTitle,
		"isupper":      jsIsUpper,
		"join":         jsJoin,
		"ljust":        jsJust(true),
		"lower":        jsLower,
		"lstrip":       jsStrip(true, false),
		"partition":    jsPartition(false),
		"removeprefix": jsRemovePrefix,
		"removesuffix": jsRemoveSuffix,
		"replace":      jsReplace,
		"rfind":        jsFind(true, false),
		"rindex":       jsFind(true, true),
		"rjust":        jsJust(false),
		"rpartition":   jsPartition(true),
		"rsplit":       jsSplit(true),
		"rstrip":       jsStrip(false, true),
		"split":        jsSplit(false),
		"splitlines":   jsSplitlines,
		"startswith":   jsStartswith,
		"strip":        jsStrip(true, true),
		"swapcase":     jsSwapcase,
		"title":        jsTitle,
		"upper":        jsUpper,
		"zfill":        jsZfill,
	}
	jDictMethodFns = map[string]jMethodFn{
		"get":    jdGet,
		"items":  jdItems,
		"keys":   jdKeys,
		"values": jdValues,
		"copy":   jdCopy,
	}
	jListMethodFns = map[string]jMethodFn{
		"count": jlCount,
		"index": jlIndex,
		"copy":  jlCopy,
	}
	fn := func(name string, f jBuiltin) jGlobal {
		return jGlobal{name: name, v: jv{k: jkFunc, o: &jCallable{name: name, fn: f}}}
	}
	jGlobals = []jGlobal{
		fn("range", jgRange),
		fn("dict", jgDict),
		fn("namespace", jgNamespace),
		fn("cycler", jgCycler),
		fn("joiner", jgJoiner),
		fn("raise_exception", jgRaiseException),
		fn("strftime_now", jgStrftimeNow),
	}
}

// ---- argument binding ----

// jBind binds positional and keyword arguments to the named parameters of a Python
// function. Parameters not given are jkMissing.
func jBind(fname string, params []string, args []jv, kw jKw) ([]jv, error) {
	if len(args) > len(params) {
		return nil, jErrorf("TypeError", "%s() takes %d positional arguments but %d were given", fname, len(params), len(args))
	}
	out := make([]jv, len(params))
	for i := range out {
		out[i] = jv{k: jkMissing}
	}
	copy(out, args)
	for i, n := range kw.names {
		found := false
		for j, p := range params {
			if p == n {
				if j < len(args) || out[j].k != jkMissing {
					return nil, jErrorf("TypeError", "%s() got multiple values for argument '%s'", fname, n)
				}
				out[j] = kw.vals[i]
				found = true
				break
			}
		}
		if !found {
			return nil, jErrorf("TypeError", "%s() got an unexpected keyword argument '%s'", fname, n)
		}
	}
	return out, nil
}

func jOr(v jv, def jv) jv {
	if v.k == jkMissing {
		return def
	}
	return v
}

// jSoftStr is jinja2's soft_str: str(), with Undefined as "".
func jSoftStr(v jv) string { return jStr(v) }

func jWantInt(fname string, v jv) (int, error) {
	switch v.k {
	case jkInt, jkBool:
		if v.n > math.MaxInt32 || v.n < math.MinInt32 {
			return 0, jErrorf("OverflowError", "%s: integer too large", fname)
		}
		return int(v.n), nil
	case jkUndef:
		return 0, jUndefError(v)
	}
	return 0, jErrorf("TypeError", "'%s' object cannot be interpreted as an integer", jValueTypeName(v))
}

func jWantStr(fname string, v jv) (string, error) {
	switch v.k {
	case jkStr:
		return v.s, nil
	case jkUndef:
		return "", jUndefError(v)
	}
	return "", jErrorf("TypeError", "%s() argument must be str, not %s", fname, jValueTypeName(v))
}

// ---- filter application ----

func (e *jEval) applyFilter(f *jeFilter, v jv, s *jScope) (jv, error) {
	if f.fn == nil {
		return jv{}, jErrorf("TemplateRuntimeError", "No filter named '%s' found.", f.name)
	}
	args, kw, err := e.evalArgs(&f.args, s)
	if err != nil {
		return jv{}, err
	}
	return f.fn(e, v, args, kw)
}

// applyFilterChain applies a filter chain whose innermost input is nil (block filters).
func (e *jEval) applyFilterChain(x jExpr, v jv, s *jScope) (jv, error) {
	f, ok := x.(*jeFilter)
	if !ok {
		return e.eval(x, s)
	}
	if f.e != nil {
		var err error
		if v, err = e.applyFilterChain(f.e, v, s); err != nil {
			return jv{}, err
		}
	}
	return e.applyFilter(f, v, s)
}

func (e *jEval) callFilter(name string, v jv, args []jv, kw jKw) (jv, error) {
	f := jFilters[name]
	if f == nil {
		return jv{}, jErrorf("TemplateRuntimeError", "No filter named '%s'.", name)
	}
	return f(e, v, args, kw)
}

func (e *jEval) callTest(name string, v jv, args []jv, kw jKw) (bool, error) {
	t := jTests[name]
	if t == nil {
		return false, jErrorf("TemplateRuntimeError", "No test named '%s'.", name)
	}
	return t(e, v, args, kw)
}

// ---- attribute getters (make_attrgetter) ----

func jAttrParts(attr jv) []jv {
	if attr.k != jkStr {
		return []jv{attr}
	}
	var parts []jv
	for _, p := range strings.Split(attr.s, ".") {
		if n, err := strconv.Atoi(p); err == nil && p != "" && (p[0] >= '0' && p[0] <= '9') {
			parts = append(parts, jIntV(int64(n)))
		} else {
			parts = append(parts, jStrV(p))
		}
	}
	return parts
}

func (e *jEval) attrGet(item jv, parts []jv, def jv) (jv, error) {
	for _, p := range parts {
		var err error
		if item, err = e.getitem(item, p); err != nil {
			return jv{}, err
		}
		if def.k != jkMissing && def.k != jkNone && item.k == jkUndef {
			item = def
		}
	}
	return item, nil
}

func jIgnoreCase(v jv) jv {
	if v.k == jkStr {
		return jStrV(jLowerStr(v.s))
	}
	return v
}

// ---- filters ----

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

func jfAttr(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("attr", []string{"name"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	name, err := jWantStr("attr", a[0])
	if err != nil {
		return jv{}, err
	}
	if v.k == jkUndef {
		return jv{}, jUndefError(v)
	}
	if r, ok := e.attribute(v, name); ok {
		return r, nil
	}
	return jUndefAttr(v, name), nil
}

func jfBatch(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("batch", []string{"linecount", "fill_with"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	n, err := jWantInt("batch", a[0])
	if err != nil {
		return jv{}, err
	}
	if n <= 0 {
		return jv{}, jErrorf("ValueError", "batch size must be positive")
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	var out []jv
	for i := 0; i < len(items); i += n {
		end := i + n
		var row []jv
		if end > len(items) {
			row = append(row, items[i:]...)
			if a[1].k != jkMissing && a[1].k != jkNone {
				for len(row) < n {
					row = append(row, a[1])
				}
			}
		} else {
			row = append(row, items[i:end]...)
		}
		out = append(out, jListV(row))
	}
	return jGenV(out, "do_batch"), nil
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

func jfDictsort(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("dictsort", []string{"case_sensitive", "by", "reverse"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if v.k != jkDict {
		if v.k == jkUndef {
			return jv{}, jUndefError(v)
		}
		return jv{}, jErrorf("AttributeError", "'%s' object has no attribute 'items'", jValueTypeName(v))
	}
	pos := 0
	switch by := jOr(a[1], jStrV("key")); {
	case by.k == jkStr && by.s == "key":
	case by.k == jkStr && by.s == "value":
		pos = 1
	default:
		return jv{}, jErrorf("FilterArgumentError", "You can only sort by either \"key\" or \"value\"")
	}
	cs := jTruthy(jOr(a[0], jvFalse))
	d := v.dict()
	pairs := make([]jv, len(d.keys))
	for i := range d.keys {
		pairs[i] = jTupleV([]jv{d.keys[i], d.vals[i]})
	}
	key := func(p jv) jv {
		k := p.list().items[pos]
		if !cs {
			k = jIgnoreCase(k)
		}
		return k
	}
	out, err := jSortValues(pairs, key, jTruthy(jOr(a[2], jvFalse)))
	if err != nil {
		return jv{}, err
	}
	return jListV(out), nil
}

// jSortValues is Python's sorted(items, key=key, reverse=reverse) (stable).
func jSortValues(items []jv, key func(jv) jv, reverse bool) ([]jv, error) {
	keys := make([]jv, len(items))
	for i, it := range items {
		keys[i] = key(it)
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var cmpErr error
	less := func(x, y int) bool {
		if cmpErr != nil {
			return false
		}
		a, b := keys[x], keys[y]
		if reverse {
			a, b = b, a
		}
		c, err := jCompare("<", a, b)
		if err == errNaNCompare {
			return false
		}
		if err != nil {
			cmpErr = err
			return false
		}
		return c < 0
	}
	jSortInts(idx, less)
	if cmpErr != nil {
		return nil, cmpErr
	}
	out := make([]jv, len(items))
	for i, j := range idx {
		out[i] = items[j]
	}
	return out, nil
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

func jfFirst(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	if v.k == jkGen {
		g := v.o.(*jGen)
		if g.pos < len(g.items) {
			g.pos++
			return g.items[g.pos-1], nil
		}
		return jUndefHinted("No first item, sequence was empty.", false), nil
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if len(items) == 0 {
		return jUndefHinted("No first item, sequence was empty.", false), nil
	}
	return items[0], nil
}

func jfLast(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	if v.k == jkGen {
		return jv{}, jErrorf("TypeError", "'%s' object is not reversible", jValueTypeName(v))
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if len(items) == 0 {
		return jUndefHinted("No last item, sequence was empty.", false), nil
	}
	return items[len(items)-1], nil
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

func jfGroupby(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("groupby", []string{"attribute", "default", "case_sensitive"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if a[0].k == jkMissing {
		return jv{}, jErrorf("TypeError", "groupby() missing 1 required positional argument: 'attribute'")
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	parts := jAttrParts(a[0])
	cs := jTruthy(jOr(a[2], jvFalse))
	def := jOr(a[1], jvNone)
	key := func(it jv) jv {
		k, err2 := e.attrGet(it, parts, def)
		if err2 != nil {
			err = err2
		}
		if !cs {
			k = jIgnoreCase(k)
		}
		return k
	}
	sorted, err2 := jSortValues(items, key, false)
	if err != nil {
		return jv{}, err
	}
	if err2 != nil {
		return jv{}, err2
	}
	var out []jv
	for i := 0; i < len(sorted); {
		k := key(sorted[i])
		j := i + 1
		for j < len(sorted) && jEqual(key(sorted[j]), k) {
			j++
		}
		grouper := k
		if !cs {
			// the grouper is the value of the first item of the group
			g, err := e.attrGet(sorted[i], parts, def)
			if err != nil {
				return jv{}, err
			}
			grouper = g
		}
		out = append(out, jTupleV([]jv{grouper, jListV(append([]jv(nil), sorted[i:j]...))}))
		i = j
	}
	return jListV(out), nil
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

func jfItems(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	switch v.k {
	case jkUndef:
		return jGenV(nil, "do_items"), nil
	case jkDict:
		d := v.dict()
		out := make([]jv, len(d.keys))
		for i := range d.keys {
			out[i] = jTupleV([]jv{d.keys[i], d.vals[i]})
		}
		return jGenV(out, "do_items"), nil
	}
	return jv{}, jErrorf("TypeError", "Can only get item pairs from a mapping.")
}

func jfJoin(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("join", []string{"d", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if a[1].k != jkMissing && a[1].k != jkNone {
		parts := jAttrParts(a[1])
		mapped := make([]jv, len(items))
		for i, it := range items {
			if mapped[i], err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		items = mapped
	}
	sep := jSoftStr(jOr(a[0], jvEmptyStr))
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(sep)
		}
		jWriteStr(&b, it)
	}
	return jStrV(b.String()), nil
}

func jfLength(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	n, err := jLen(v)
	if err != nil {
		return jv{}, err
	}
	return jIntV(int64(n)), nil
}

func jfList(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	return jListV(append([]jv(nil), items...)), nil
}

func jfLower(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	return jStrV(jLowerStr(jSoftStr(v))), nil
}

func jfUpper(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	return jStrV(jUpperStr(jSoftStr(v))), nil
}

func jfMap(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	out := make([]jv, len(items))
	if len(args) == 0 {
		attr, ok := kw.get("attribute")
		if !ok {
			return jv{}, jErrorf("FilterArgumentError", "map requires a filter argument")
		}
		def := jv{k: jkMissing}
		for i, n := range kw.names {
			switch n {
			case "attribute":
			case "default":
				def = kw.vals[i]
			default:
				return jv{}, jErrorf("FilterArgumentError", "Unexpected keyword argument %s", jPyQuote(n))
			}
		}
		parts := jAttrParts(attr)
		for i, it := range items {
			if out[i], err = e.attrGet(it, parts, def); err != nil {
				return jv{}, err
			}
		}
		return jGenV(out, "do_map"), nil
	}
	name, err := jWantStr("map", args[0])
	if err != nil {
		return jv{}, err
	}
	for i, it := range items {
		if out[i], err = e.callFilter(name, it, args[1:], kw); err != nil {
			return jv{}, err
		}
	}
	return jGenV(out, "do_map"), nil
}

func jMinMax(e *jEval, v jv, args []jv, kw jKw, fname string, wantMax bool) (jv, error) {
	a, err := jBind(fname, []string{"case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	if len(items) == 0 {
		return jUndefHinted("No aggregated item, sequence was empty.", false), nil
	}
	cs := jTruthy(jOr(a[0], jvFalse))
	var parts []jv
	if a[1].k != jkMissing && a[1].k != jkNone {
		parts = jAttrParts(a[1])
	}
	key := func(it jv) (jv, error) {
		k := it
		if parts != nil {
			var err error
			if k, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		if !cs {
			k = jIgnoreCase(k)
		}
		return k, nil
	}
	best := items[0]
	bestKey, err := key(best)
	if err != nil {
		return jv{}, err
	}
	for _, it := range items[1:] {
		k, err := key(it)
		if err != nil {
			return jv{}, err
		}
		var c int
		if wantMax {
			c, err = jCompare(">", k, bestKey)
		} else {
			c, err = jCompare("<", k, bestKey)
			c = -c
		}
		if err != nil && err != errNaNCompare {
			return jv{}, err
		}
		if err == nil && c > 0 {
			best, bestKey = it, k
		}
	}
	return best, nil
}

func jfMax(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return jMinMax(e, v, args, kw, "max", true)
}
func jfMin(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return jMinMax(e, v, args, kw, "min", false)
}

func jfPprint(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) { return jStrV(jRepr(v)), nil }

func (e *jEval) selectOrReject(v jv, args []jv, kw jKw, attr, keep bool) (jv, error) {
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	off := 0
	var parts []jv
	if attr {
		if len(args) == 0 {
			return jv{}, jErrorf("FilterArgumentError", "Missing parameter for attribute name")
		}
		parts = jAttrParts(args[0])
		off = 1
	}
	testName := ""
	var testArgs []jv
	if len(args) > off {
		if testName, err = jWantStr("select", args[off]); err != nil {
			return jv{}, err
		}
		testArgs = args[off+1:]
	}
	var out []jv
	for _, it := range items {
		x := it
		if attr {
			if x, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		var ok bool
		if testName == "" {
			ok = jTruthy(x)
		} else if ok, err = e.callTest(testName, x, testArgs, kw); err != nil {
			return jv{}, err
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return jGenV(out, "select_or_reject"), nil
}

func jfSelect(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, false, true)
}
func jfReject(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, false, false)
}
func jfSelectattr(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, true, true)
}
func jfRejectattr(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	return e.selectOrReject(v, args, kw, true, false)
}

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

func jfReverse(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) {
	if v.k == jkStr {
		r := []rune(v.s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return jStrV(string(r)), nil
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, jErrorf("FilterArgumentError", "argument must be iterable")
	}
	out := make([]jv, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	switch v.k {
	case jkGen:
		return jListV(out), nil // reversed() fails on iterators; jinja2 falls back to a list
	case jkList:
		return jv{k: jkGen, o: &jGen{items: out, name: "list_reverseiterator"}}, nil
	case jkDict, jkView:
		return jv{k: jkGen, o: &jGen{items: out, name: "dict_reversekeyiterator"}}, nil
	}
	return jv{k: jkGen, o: &jGen{items: out, name: "reversed"}}, nil
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

func jfSlice(_ *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("slice", []string{"slices", "fill_with"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	n, err := jWantInt("slice", a[0])
	if err != nil {
		return jv{}, err
	}
	if n <= 0 {
		return jv{}, jErrorf("ZeroDivisionError", "integer division or modulo by zero")
	}
	seq, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	length := len(seq)
	per := length / n
	extra := length % n
	offset := 0
	var out []jv
	for i := 0; i < n; i++ {
		start := offset + i*per
		if i < extra {
			offset++
		}
		end := offset + (i+1)*per
		tmp := append([]jv(nil), seq[start:end]...)
		if a[1].k != jkMissing && a[1].k != jkNone && i >= extra {
			tmp = append(tmp, a[1])
		}
		out = append(out, jListV(tmp))
	}
	return jGenV(out, "sync_do_slice"), nil
}

func jfSort(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("sort", []string{"reverse", "case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	cs := jTruthy(jOr(a[1], jvFalse))
	var attrs [][]jv
	if a[2].k != jkMissing && a[2].k != jkNone {
		if a[2].k == jkStr {
			for _, part := range strings.Split(a[2].s, ",") {
				attrs = append(attrs, jAttrParts(jStrV(part)))
			}
		} else {
			attrs = [][]jv{{a[2]}}
		}
	}
	var kerr error
	key := func(it jv) jv {
		if attrs == nil {
			if !cs {
				return jIgnoreCase(it)
			}
			return it
		}
		ks := make([]jv, len(attrs))
		for i, p := range attrs {
			k, err := e.attrGet(it, p, jv{k: jkMissing})
			if err != nil {
				kerr = err
			}
			if !cs {
				k = jIgnoreCase(k)
			}
			ks[i] = k
		}
		if len(ks) == 1 {
			return ks[0]
		}
		return jListV(ks)
	}
	out, err := jSortValues(items, key, jTruthy(jOr(a[0], jvFalse)))
	if kerr != nil {
		return jv{}, kerr
	}
	if err != nil {
		return jv{}, err
	}
	return jListV(out), nil
}

func jfString(_ *jEval, v jv, _ []jv, _ jKw) (jv, error) { return jStrV(jSoftStr(v)), nil }

func jfSum(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("sum", []string{"attribute", "start"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	acc := jOr(a[1], jIntV(0))
	var parts []jv
	if a[0].k != jkMissing && a[0].k != jkNone {
		parts = jAttrParts(a[0])
	}
	for _, it := range items {
		if parts != nil {
			if it, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		if acc.k == jkStr {
			return jv{}, jErrorf("TypeError", "sum() can't sum strings [use ''.join(seq) instead]")
		}
		if acc, err = jAdd(acc, it); err != nil {
			return jv{}, err
		}
	}
	return acc, nil
}

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

func jfUnique(e *jEval, v jv, args []jv, kw jKw) (jv, error) {
	a, err := jBind("unique", []string{"case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	items, err := jIterate(v)
	if err != nil {
		return jv{}, err
	}
	cs := jTruthy(jOr(a[0], jvFalse))
	var parts []jv
	if a[1].k != jkMissing && a[1].k != jkNone {
		parts = jAttrParts(a[1])
	}
	var seen []jv
	var out []jv
outer:
	for _, it := range items {
		k := it
		if parts != nil {
			if k, err = e.attrGet(it, parts, jv{k: jkMissing}); err != nil {
				return jv{}, err
			}
		}
		if !cs {
			k = jIgnoreCase(k)
		}
		if !jHashable(k) {
			return jv{}, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(k))
		}
		for _, s := range seen {
			if jEqual(s, k) {
				continue outer
			}
		}
		seen = append(seen, k)
		out = append(out, it)
	}
	return jGenV(out, "do_unique"), nil
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

// ---- tests ----

func jtBoolean(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) { return v.k == jkBool, nil }

func jtCallable(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	switch v.k {
	case jkFunc, jkUndef, jkJoiner, jkLoop:
		return true, nil
	}
	return false, nil
}

func jtCmp(op string) jTestFn {
	return func(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
		a, err := jBind(op, []string{"other"}, args, kw)
		if err != nil {
			return false, err
		}
		if a[0].k == jkMissing {
			return false, jErrorf("TypeError", "test '%s' requires an argument", op)
		}
		return jCompareOp(op, v, a[0])
	}
}

func jtDivisibleby(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
	a, err := jBind("divisibleby", []string{"num"}, args, kw)
	if err != nil {
		return false, err
	}
	r, err := jBinary("%", v, a[0])
	if err != nil {
		return false, err
	}
	return jEqual(r, jIntV(0)), nil
}

func jtEven(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	r, err := jBinary("%", v, jIntV(2))
	if err != nil {
		return false, err
	}
	return jEqual(r, jIntV(0)), nil
}

func jtOdd(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	r, err := jBinary("%", v, jIntV(2))
	if err != nil {
		return false, err
	}
	return jEqual(r, jIntV(1)), nil
}

func jtFilter(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return v.k == jkStr && jFilters[v.s] != nil, nil
}

func jtTest(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return v.k == jkStr && jTests[v.s] != nil, nil
}

func jtIn(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
	a, err := jBind("in", []string{"seq"}, args, kw)
	if err != nil {
		return false, err
	}
	return jContains(a[0], v)
}

func jtIterable(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	switch v.k {
	case jkStr, jkList, jkTuple, jkDict, jkUndef, jkLoop, jkGen, jkView:
		return true, nil
	}
	return false, nil
}

func jtSequence(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	switch v.k {
	case jkStr, jkList, jkTuple, jkDict, jkUndef:
		return true, nil
	}
	return false, nil
}

func jtLower(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return jIsLowerStr(jSoftStr(v)), nil
}

func jtUpper(_ *jEval, v jv, _ []jv, _ jKw) (bool, error) {
	return jIsUpperStr(jSoftStr(v)), nil
}

func jtSameas(_ *jEval, v jv, args []jv, kw jKw) (bool, error) {
	a, err := jBind("sameas", []string{"other"}, args, kw)
	if err != nil {
		return false, err
	}
	o := a[0]
	if v.k != o.k {
		return false, nil
	}
	switch v.k {
	case jkNone, jkUndef:
		return v.k == jkNone, nil
	case jkBool, jkInt:
		return v.n == o.n, nil
	case jkStr:
		return v.s == o.s, nil
	case jkFloat:
		return false, nil
	}
	return v.o == o.o, nil
}

// ---- globals ----

func jgRange(_ *jEval, args []jv, kw jKw) (jv, error) {
	if len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "range() takes no keyword arguments")
	}
	var start, stop, step int64 = 0, 0, 1
	ints := make([]int64, len(args))
	for i, a := range args {
		if a.k != jkInt && a.k != jkBool {
			if a.k == jkUndef {
				return jv{}, jUndefError(a)
			}
			return jv{}, jErrorf("TypeError", "'%s' object cannot be interpreted as an integer", jValueTypeName(a))
		}
		ints[i] = a.n
	}
	switch len(args) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return jv{}, jErrorf("TypeError", "range expected at most 3 arguments, got %d", len(args))
	}
	if step == 0 {
		return jv{}, jErrorf("ValueError", "range() arg 3 must not be zero")
	}
	var n int64
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && stop < start {
		n = (start - stop - step - 1) / -step
	}
	if n > 100000 {
		return jv{}, jErrorf("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).")
	}
	out := make([]jv, n)
	for i := int64(0); i < n; i++ {
		out[i] = jIntV(start + i*step)
	}
	return jListV(out), nil
}

// jDictFrom is dict(*args, **kwargs).
func jDictFrom(fname string, args []jv, kw jKw) (*jDict, error) {
	if len(args) > 1 {
		return nil, jErrorf("TypeError", "%s expected at most 1 argument, got %d", fname, len(args))
	}
	d := jNewDict(len(kw.names))
	if len(args) == 1 {
		src := args[0]
		switch src.k {
		case jkDict:
			s := src.dict()
			for i := range s.keys {
				d.set(s.keys[i], s.vals[i])
			}
		default:
			items, err := jIterate(src)
			if err != nil {
				return nil, err
			}
			for i, it := range items {
				pair, err := jIterate(it)
				if err != nil {
					return nil, jErrorf("TypeError", "cannot convert dictionary update sequence element #%d to a sequence", i)
				}
				if len(pair) != 2 {
					return nil, jErrorf("ValueError", "dictionary update sequence element #%d has length %d; 2 is required", i, len(pair))
				}
				if !jHashable(pair[0]) {
					return nil, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(pair[0]))
				}
				d.set(pair[0], pair[1])
			}
		}
	}
	for i, n := range kw.names {
		d.set(jStrV(n), kw.vals[i])
	}
	return d, nil
}

func jgDict(_ *jEval, args []jv, kw jKw) (jv, error) {
	d, err := jDictFrom("dict", args, kw)
	if err != nil {
		return jv{}, err
	}
	return jDictV(d), nil
}

func jgNamespace(_ *jEval, args []jv, kw jKw) (jv, error) {
	d, err := jDictFrom("dict", args, kw)
	if err != nil {
		return jv{}, err
	}
	ns := &jNamespace{}
	for i, k := range d.keys {
		if k.k != jkStr {
			return jv{}, jErrorf("TypeError", "keywords must be strings")
		}
		ns.keys = append(ns.keys, k.s)
		ns.vals = append(ns.vals, d.vals[i])
	}
	return jv{k: jkNS, o: ns}, nil
}

func jgCycler(_ *jEval, args []jv, kw jKw) (jv, error) {
	if len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "cycler() got an unexpected keyword argument '%s'", kw.names[0])
	}
	if len(args) == 0 {
		return jv{}, jErrorf("RuntimeError", "at least one item has to be provided")
	}
	return jv{k: jkCycler, o: &jCyclerState{items: append([]jv(nil), args...)}}, nil
}

func jgJoiner(_ *jEval, args []jv, kw jKw) (jv, error) {
	a, err := jBind("joiner", []string{"sep"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	return jv{k: jkJoiner, o: &jJoinerState{sep: jSoftStr(jOr(a[0], jStrV(", ")))}}, nil
}

func jgRaiseException(_ *jEval, args []jv, kw jKw) (jv, error) {
	a, err := jBind("raise_exception", []string{"message"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	if a[0].k == jkMissing {
		return jv{}, jErrorf("TypeError", "raise_exception() missing 1 required positional argument: 'message'")
	}
	return jv{}, &jRaise{msg: jStr(a[0])}
}

func jgStrftimeNow(e *jEval, args []jv, kw jKw) (jv, error) {
	a, err := jBind("strftime_now", []string{"format"}, args, kw)
	if err != nil {
		return jv{}, err
	}
	f, err := jWantStr("strftime", a[0])
	if err != nil {
		return jv{}, err
	}
	now := time.Now
	if e.now != nil {
		now = e.now
	}
	return jStrV(jStrftime(now(), f)), nil
}

// jStrftime is datetime.strftime for a naive local datetime (C locale).
func jStrftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '%' || i+1 >= len(f) {
			b.WriteByte(c)
			continue
		}
		i++
		switch f[i] {
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'w':
			b.WriteString(strconv.Itoa(int(t.Weekday())))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'z', 'Z':
			// datetime.now() is naive: empty
		case 'D':
			fmt.Fprintf(&b, "%02d/%02d/%02d", int(t.Month()), t.Day(), t.Year()%100)
		case 'F':
			fmt.Fprintf(&b, "%d-%02d-%02d", t.Year(), int(t.Month()), t.Day())
		case 'T':
			fmt.Fprintf(&b, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case 'R':
			fmt.Fprintf(&b, "%02d:%02d", t.Hour(), t.Minute())
		case 'c':
			fmt.Fprintf(&b, "%s %s %2d %02d:%02d:%02d %d", t.Weekday().String()[:3], t.Month().String()[:3], t.Day(), t.Hour(), t.Minute(), t.Second(), t.Year())
		case 'x':
			fmt.Fprintf(&b, "%02d/%02d/%02d", int(t.Month()), t.Day(), t.Year()%100)
		case 'X':
			fmt.Fprintf(&b, "%02d:%02d:%02d", t.Hour(), t.Minute(), t.Second())
		case 'U':
			fmt.Fprintf(&b, "%02d", (t.YearDay()+6-int(t.Weekday()))/7)
		case 'W':
			fmt.Fprintf(&b, "%02d", (t.YearDay()+6-(int(t.Weekday())+6)%7)/7)
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			b.WriteString(strconv.Itoa(wd))
		case 'G':
			y, _ := t.ISOWeek()
			b.WriteString(strconv.Itoa(y))
		case 'V':
			_, w := t.ISOWeek()
			fmt.Fprintf(&b, "%02d", w)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

// ---- case mapping (Python's full Unicode case mapping) ----

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

// jStrFormat is str.format as jinja2's sandboxed formatter runs it: replacement fields
// with automatic or explicit indexes, keyword names, .attr and [key] lookups (through
// the sandbox), !s/!r conversions and a format spec.
func jStrFormat(e *jEval, f string, args []jv, kw jKw) (string, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c == '}' {
			if i+1 < len(f) && f[i+1] == '}' {
				b.WriteByte('}')
				i++
				continue
			}
			return "", jErrorf("ValueError", "Single '}' encountered in format string")
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(f) && f[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		depth := 1
		j := i + 1
		for ; j < len(f); j++ {
			if f[j] == '{' {
				depth++
			} else if f[j] == '}' {
				depth--
				if depth == 0 {
					break
				}
			}
		}
		if j >= len(f) {
			return "", jErrorf("ValueError", "expected '}' before end of string")
		}
		field := f[i+1 : j]
		i = j
		spec := ""
		conv := byte(0)
		if k := strings.IndexByte(field, ':'); k >= 0 {
			field, spec = field[:k], field[k+1:]
		}
		if k := strings.IndexByte(field, '!'); k >= 0 {
			if k+2 != len(field) {
				return "", jErrorf("ValueError", "expected ':' after conversion specifier")
			}
			conv = field[k+1]
			field = field[:k]
		}
		// first name part
		k := 0
		for k < len(field) && field[k] != '.' && field[k] != '[' {
			k++
		}
		head, rest := field[:k], field[k:]
		var v jv
		switch {
		case head == "":
			if auto < 0 {
				return "", jErrorf("ValueError", "cannot switch from manual field specification to automatic field numbering")
			}
			if auto >= len(args) {
				return "", jErrorf("IndexError", "Replacement index %d out of range for positional args tuple", auto)
			}
			v = args[auto]
			auto++
		case head[0] >= '0' && head[0] <= '9':
			n, err := strconv.Atoi(head)
			if err != nil {
				return "", jErrorf("ValueError", "invalid field name %s", head)
			}
			if auto > 0 {
				return "", jErrorf("ValueError", "cannot switch from automatic field numbering to manual field specification")
			}
			auto = -1
			if n >= len(args) {
				return "", jErrorf("IndexError", "Replacement index %d out of range for positional args tuple", n)
			}
			v = args[n]
		default:
			x, ok := kw.get(head)
			if !ok {
				return "", jErrorf("KeyError", "%s", jPyQuote(head))
			}
			v = x
		}
		for rest != "" {
			var err error
			if rest[0] == '.' {
				k := 1
				for k < len(rest) && rest[k] != '.' && rest[k] != '[' {
					k++
				}
				if v, err = e.getattr(v, rest[1:k]); err != nil {
					return "", err
				}
				rest = rest[k:]
				continue
			}
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return "", jErrorf("ValueError", "Missing ']' in format string")
			}
			key := rest[1:end]
			var kv jv = jStrV(key)
			if n, err := strconv.Atoi(key); err == nil {
				kv = jIntV(int64(n))
			}
			if v, err = e.getitem(v, kv); err != nil {
				return "", err
			}
			rest = rest[end+1:]
		}
		switch conv {
		case 0, 's':
			if conv == 's' {
				v = jStrV(jStr(v))
			}
		case 'r', 'a':
			v = jStrV(jRepr(v))
		default:
			return "", jErrorf("ValueError", "Unknown conversion specifier %c", conv)
		}
		if strings.Contains(spec, "{") {
			inner, err := jStrFormat(e, spec, args, kw)
			if err != nil {
				return "", err
			}
			spec = inner
		}
		out, err := jFormatSpec(v, spec)
		if err != nil {
			return "", err
		}
		b.WriteString(out)
	}
	return b.String(), nil
}

// jFormatSpec is format(v, spec) for the common spec mini-language.
func jFormatSpec(v jv, spec string) (string, error) {
	if spec == "" {
		if v.k == jkUndef {
			return "", nil
		}
		return jStr(v), nil
	}
	fill, align := " ", byte(0)
	rs := []rune(spec)
	i := 0
	if len(rs) >= 2 && strings.ContainsRune("<>=^", rs[1]) {
		fill, align = string(rs[0]), byte(rs[1])
		i = 2
	} else if len(rs) >= 1 && strings.ContainsRune("<>=^", rs[0]) {
		align = byte(rs[0])
		i = 1
	}
	rest := string(rs[i:])
	sign := byte(0)
	if rest != "" && strings.IndexByte("+- ", rest[0]) >= 0 {
		sign = rest[0]
		rest = rest[1:]
	}
	alt := false
	if strings.HasPrefix(rest, "#") {
		alt = true
		rest = rest[1:]
	}
	if strings.HasPrefix(rest, "0") && align == 0 {
		fill, align = "0", '='
		rest = rest[1:]
	}
	width := 0
	for rest != "" && rest[0] >= '0' && rest[0] <= '9' {
		width = width*10 + int(rest[0]-'0')
		rest = rest[1:]
	}
	grouping := ""
	if rest != "" && (rest[0] == ',' || rest[0] == '_') {
		grouping = rest[:1]
		rest = rest[1:]
	}
	prec := -1
	if strings.HasPrefix(rest, ".") {
		rest = rest[1:]
		prec = 0
		for rest != "" && rest[0] >= '0' && rest[0] <= '9' {
			prec = prec*10 + int(rest[0]-'0')
			rest = rest[1:]
		}
	}
	typ := byte(0)
	if len(rest) == 1 {
		typ = rest[0]
	} else if rest != "" {
		return "", jErrorf("ValueError", "Invalid format specifier")
	}
	var body string
	neg := false
	switch {
	case v.k == jkStr || (typ == 's'):
		if v.k != jkStr {
			return "", jErrorf("ValueError", "Unknown format code 's' for object of type '%s'", jValueTypeName(v))
		}
		body = v.s
		if prec >= 0 {
			body = jTruncRunes(body, prec)
		}
		if align == 0 {
			align = '<'
		}
	case v.isNumber():
		if typ == 0 && v.k != jkFloat {
			typ = 'd'
		}
		switch typ {
		case 'd', 'n':
			if v.k == jkFloat {
				return "", jErrorf("ValueError", "Unknown format code 'd' for object of type 'float'")
			}
			n := jBigOf(v)
			if v.k == jkBool {
				n = big.NewInt(v.n)
			}
			neg = n.Sign() < 0
			body = new(big.Int).Abs(n).String()
			if grouping != "" {
				body = jGroupDigits(body, grouping)
			}
		case 'x', 'X', 'o', 'b':
			if v.k == jkFloat {
				return "", jErrorf("ValueError", "Unknown format code '%c' for object of type 'float'", typ)
			}
			n := jBigOf(v)
			neg = n.Sign() < 0
			base := map[byte]int{'x': 16, 'X': 16, 'o': 8, 'b': 2}[typ]
			body = new(big.Int).Abs(n).Text(base)
			if typ == 'X' {
				body = strings.ToUpper(body)
			}
			if alt {
				body = "0" + string(typ) + body
			}
		case 'f', 'F', 'e', 'E', 'g', 'G', '%', 0:
			f, err := jAsFloat(v)
			if err != nil {
				return "", err
			}
			neg = math.Signbit(f) && !math.IsNaN(f)
			f = math.Abs(f)
			switch typ {
			case '%':
				if prec < 0 {
					prec = 6
				}
				body = jFormatFloat(f*100, 'f', prec, alt) + "%"
			case 0:
				if prec < 0 {
					body = jFloatRepr(f)
				} else {
					body = jFormatFloat(f, 'g', prec, alt)
				}
			default:
				if prec < 0 {
					prec = 6
				}
				body = jFormatFloat(f, typ, prec, alt)
			}
			if grouping != "" {
				intPart, frac, _ := strings.Cut(body, ".")
				body = jGroupDigits(intPart, grouping)
				if frac != "" || strings.Contains(body, ".") {
					body += "." + frac
				}
			}
		default:
			return "", jErrorf("ValueError", "Unknown format code '%c' for object of type '%s'", typ, jValueTypeName(v))
		}
		if align == 0 {
			align = '>'
		}
	default:
		if typ != 0 {
			return "", jErrorf("TypeError", "unsupported format string passed to %s.__format__", jValueTypeName(v))
		}
		body = jStr(v)
		if align == 0 {
			align = '<'
		}
	}
	signStr := ""
	switch {
	case neg:
		signStr = "-"
	case sign == '+':
		signStr = "+"
	case sign == ' ':
		signStr = " "
	}
	total := jStrLen(signStr) + jStrLen(body)
	if width <= total {
		return signStr + body, nil
	}
	pad := width - total
	switch align {
	case '<':
		return signStr + body + strings.Repeat(fill, pad), nil
	case '>':
		return strings.Repeat(fill, pad) + signStr + body, nil
	case '=':
		return signStr + strings.Repeat(fill, pad) + body, nil
	}
	left := pad / 2
	return strings.Repeat(fill, left) + signStr + body + strings.Repeat(fill, pad-left), nil
}

func jGroupDigits(s, sep string) string {
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	first := len(s) % 3
	if first > 0 {
		b.WriteString(s[:first])
	}
	for i := first; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// ---- dict and list methods ----

func jdGet(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.get() takes no keyword arguments")
	}
	if len(args) < 1 || len(args) > 2 {
		return jv{}, jErrorf("TypeError", "get expected at least 1 argument, got %d", len(args))
	}
	if !jHashable(args[0]) {
		return jv{}, jErrorf("TypeError", "unhashable type: '%s'", jValueTypeName(args[0]))
	}
	if v, ok := r.dict().get(args[0]); ok {
		return v, nil
	}
	if len(args) == 2 {
		return args[1], nil
	}
	return jvNone, nil
}

func jdItems(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.items() takes no arguments (%d given)", len(args))
	}
	d := r.dict()
	out := make([]jv, len(d.keys))
	pairs := make([]jList, len(d.keys))
	for i := range d.keys {
		pairs[i].items = []jv{d.keys[i], d.vals[i]}
		out[i] = jv{k: jkTuple, o: &pairs[i]}
	}
	return jv{k: jkView, o: &jView{items: out, name: "dict_items"}}, nil
}

func jdKeys(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.keys() takes no arguments (%d given)", len(args))
	}
	return jv{k: jkView, o: &jView{items: r.dict().keys, name: "dict_keys"}}, nil
}

func jdValues(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) > 0 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "dict.values() takes no arguments (%d given)", len(args))
	}
	return jv{k: jkView, o: &jView{items: r.dict().vals, name: "dict_values"}}, nil
}

func jdCopy(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) { return jDictV(r.dict().copy()), nil }

func jlCount(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) != 1 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "count() takes exactly one argument (%d given)", len(args))
	}
	n := 0
	for _, it := range r.list().items {
		if jEqual(it, args[0]) {
			n++
		}
	}
	return jIntV(int64(n)), nil
}

func jlIndex(_ *jEval, r jv, args []jv, kw jKw) (jv, error) {
	if len(args) < 1 || len(args) > 3 || len(kw.names) > 0 {
		return jv{}, jErrorf("TypeError", "index expected at least 1 argument, got %d", len(args))
	}
	items := r.list().items
	start, stop := 0, len(items)
	for i, a := range args[1:] {
		if a.k != jkInt && a.k != jkBool {
			return jv{}, jErrorf("TypeError", "slice indices must be integers or have an __index__ method")
		}
		v := int(a.n)
		if v < 0 {
			v += len(items)
			if v < 0 {
				v = 0
			}
		}
		if v > len(items) {
			v = len(items)
		}
		if i == 0 {
			start = v
		} else {
			stop = v
		}
	}
	for i := start; i < stop; i++ {
		if jEqual(items[i], args[0]) {
			return jIntV(int64(i)), nil
		}
	}
	return jv{}, jErrorf("ValueError", "%s is not in list", jRepr(args[0]))
}

func jlCopy(_ *jEval, r jv, _ []jv, _ jKw) (jv, error) {
	return jListV(append([]jv(nil), r.list().items...)), nil
}
