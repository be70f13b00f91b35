package jinja

// Builtins: the registries of jinja2's default filters and tests, the globals of the
// transformers environment (range, dict, namespace, cycler, joiner, raise_exception,
// strftime_now) and the Python methods of str, dict and list that templates call, and
// the argument binding they share. Semantics follow jinja2 3.1's filters.py/tests.py
// and CPython.
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
	"math"
	"strconv"
	"strings"
	"unicode"
)

type jFilterFn func(e *jEval, v jv, args []jv, kw jKw) (jv, error)
type jTestFn func(e *jEval, v jv, args []jv, kw jKw) (bool, error)

var (
	jFilters       map[string]jFilterFn
	jTests         map[string]jTestFn
	jStrMethods    map[string]jMethodFn
	jDictMethodFns map[string]jMethodFn
	jListMethodFns map[string]jMethodFn
	jGlobals       jScope // the parent scope of every render's variables; never changed after init
)

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
	for _, g := range []struct {
		name string
		fn   jBuiltin
	}{
		{"range", jgRange},
		{"dict", jgDict},
		{"namespace", jgNamespace},
		{"cycler", jgCycler},
		{"joiner", jgJoiner},
		{"raise_exception", jgRaiseException},
		{"strftime_now", jgStrftimeNow},
	} {
		jGlobals.set(g.name, jv{k: jkFunc, o: &jCallable{name: g.name, fn: g.fn}})
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
