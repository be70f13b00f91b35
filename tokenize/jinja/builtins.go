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

type filterFunc func(e *evaluator, v Value, args []Value, kw kwargs) (Value, error)
type testFunc func(e *evaluator, v Value, args []Value, kw kwargs) (bool, error)

var (
	filters         map[string]filterFunc
	tests           map[string]testFunc
	strMethods      map[string]methodFunc
	dictMethodFuncs map[string]methodFunc
	listMethodFuncs map[string]methodFunc
	globals         scope // the parent scope of every render's variables; never changed after init
)

func init() {
	filters = map[string]filterFunc{
		"abs":        filterAbs,
		"attr":       filterAttr,
		"batch":      filterBatch,
		"capitalize": filterCapitalize,
		"center":     filterCenter,
		"count":      filterLength,
		"d":          filterDefault,
		"default":    filterDefault,
		"dictsort":   filterDictsort,
		"e":          filterEscape,
		"escape":     filterEscape,
		"first":      filterFirst,
		"float":      filterFloat,
		"format":     filterFormat,
		"groupby":    filterGroupby,
		"indent":     filterIndent,
		"int":        filterInt,
		"items":      filterItems,
		"join":       filterJoin,
		"last":       filterLast,
		"length":     filterLength,
		"list":       filterList,
		"lower":      filterLower,
		"map":        filterMap,
		"max":        filterMax,
		"min":        filterMin,
		"pprint":     filterPprint,
		"reject":     filterReject,
		"rejectattr": filterRejectattr,
		"replace":    filterReplace,
		"reverse":    filterReverse,
		"round":      filterRound,
		"safe":       filterSafe,
		"select":     filterSelect,
		"selectattr": filterSelectattr,
		"slice":      filterSlice,
		"sort":       filterSort,
		"string":     filterString,
		"sum":        filterSum,
		"title":      filterTitle,
		"tojson":     filterToJSON,
		"trim":       filterTrim,
		"truncate":   filterTruncate,
		"unique":     filterUnique,
		"upper":      filterUpper,
		"wordcount":  filterWordcount,
	}
	tests = map[string]testFunc{
		"boolean":     testBoolean,
		"callable":    testCallable,
		"defined":     func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.k != KindUndefined, nil },
		"divisibleby": testDivisibleby,
		"eq":          testCmp("=="),
		"equalto":     testCmp("=="),
		"==":          testCmp("=="),
		"escaped":     func(_ *evaluator, _ Value, _ []Value, _ kwargs) (bool, error) { return false, nil },
		"even":        testEven,
		"false": func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
			return v.k == KindBool && v.n == 0, nil
		},
		"filter":      testFilter,
		"float":       func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.k == KindFloat, nil },
		"ge":          testCmp(">="),
		">=":          testCmp(">="),
		"gt":          testCmp(">"),
		">":           testCmp(">"),
		"greaterthan": testCmp(">"),
		"in":          testIn,
		"integer": func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
			return v.k == KindInt || v.k == kindBig, nil
		},
		"iterable": testIterable,
		"le":       testCmp("<="),
		"<=":       testCmp("<="),
		"lower":    testLower,
		"lt":       testCmp("<"),
		"<":        testCmp("<"),
		"lessthan": testCmp("<"),
		"mapping":  func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.k == KindDict, nil },
		"ne":       testCmp("!="),
		"!=":       testCmp("!="),
		"none":     func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.k == KindNone, nil },
		"number":   func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.isNumber(), nil },
		"odd":      testOdd,
		"sameas":   testSameas,
		"sequence": testSequence,
		"string":   func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.k == KindString, nil },
		"test":     testTest,
		"true": func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) {
			return v.k == KindBool && v.n == 1, nil
		},
		"undefined": func(_ *evaluator, v Value, _ []Value, _ kwargs) (bool, error) { return v.k == KindUndefined, nil },
		"upper":     testUpper,
	}
	strMethods = map[string]methodFunc{
		"capitalize":   strCapitalize,
		"casefold":     strLower,
		"center":       strCenter,
		"count":        strCount,
		"endswith":     strEndswith,
		"expandtabs":   strExpandtabs,
		"find":         strFind(false, false),
		"format":       strFormat,
		"format_map":   strFormatMap,
		"index":        strFind(false, true),
		"isalnum":      strIsPred(func(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) }),
		"isalpha":      strIsPred(unicode.IsLetter),
		"isascii":      strIsASCII,
		"isdecimal":    strIsPred(func(r rune) bool { return unicode.Is(unicode.Nd, r) }),
		"isdigit":      strIsPred(func(r rune) bool { return unicode.Is(unicode.Nd, r) || unicode.Is(unicode.No, r) }),
		"islower":      strIsLower,
		"isnumeric":    strIsPred(unicode.IsNumber),
		"isspace":      strIsPred(pyIsSpace),
		"istitle":      strIsTitle,
		"isupper":      strIsUpper,
		"join":         strJoin,
		"ljust":        strJust(true),
		"lower":        strLower,
		"lstrip":       strStrip(true, false),
		"partition":    strPartition(false),
		"removeprefix": strRemovePrefix,
		"removesuffix": strRemoveSuffix,
		"replace":      strReplace,
		"rfind":        strFind(true, false),
		"rindex":       strFind(true, true),
		"rjust":        strJust(false),
		"rpartition":   strPartition(true),
		"rsplit":       strSplit(true),
		"rstrip":       strStrip(false, true),
		"split":        strSplit(false),
		"splitlines":   strSplitlines,
		"startswith":   strStartswith,
		"strip":        strStrip(true, true),
		"swapcase":     strSwapcase,
		"title":        strTitle,
		"upper":        strUpper,
		"zfill":        strZfill,
	}
	dictMethodFuncs = map[string]methodFunc{
		"get":    dictGet,
		"items":  dictItems,
		"keys":   dictKeys,
		"values": dictValues,
		"copy":   dictCopy,
	}
	listMethodFuncs = map[string]methodFunc{
		"count": listCount,
		"index": listIndex,
		"copy":  listCopy,
	}
	for _, g := range []struct {
		name string
		fn   builtin
	}{
		{"range", globalRange},
		{"dict", globalDict},
		{"namespace", globalNamespace},
		{"cycler", globalCycler},
		{"joiner", globalJoiner},
		{"raise_exception", globalRaiseException},
		{"strftime_now", globalStrftimeNow},
	} {
		globals.set(g.name, Value{k: kindFunc, o: &callable{name: g.name, fn: g.fn}})
	}
}

// ---- argument binding ----

// bind binds positional and keyword arguments to the named parameters of a Python
// function. Parameters not given are kindMissing.
func bind(fname string, params []string, args []Value, kw kwargs) ([]Value, error) {
	if len(args) > len(params) {
		return nil, errorf("TypeError", "%s() takes %d positional arguments but %d were given", fname, len(params), len(args))
	}
	out := make([]Value, len(params))
	for i := range out {
		out[i] = Value{k: kindMissing}
	}
	copy(out, args)
	for i, n := range kw.names {
		found := false
		for j, p := range params {
			if p == n {
				if j < len(args) || out[j].k != kindMissing {
					return nil, errorf("TypeError", "%s() got multiple values for argument '%s'", fname, n)
				}
				out[j] = kw.vals[i]
				found = true
				break
			}
		}
		if !found {
			return nil, errorf("TypeError", "%s() got an unexpected keyword argument '%s'", fname, n)
		}
	}
	return out, nil
}

func orDefault(v Value, def Value) Value {
	if v.k == kindMissing {
		return def
	}
	return v
}

// softStr is jinja2's soft_str: str(), with Undefined as "".
func softStr(v Value) string { return v.String() }

func wantInt(fname string, v Value) (int, error) {
	switch v.k {
	case KindInt, KindBool:
		if v.n > math.MaxInt32 || v.n < math.MinInt32 {
			return 0, errorf("OverflowError", "%s: integer too large", fname)
		}
		return int(v.n), nil
	case KindUndefined:
		return 0, undefinedError(v)
	}
	return 0, errorf("TypeError", "'%s' object cannot be interpreted as an integer", v.TypeName())
}

func wantStr(fname string, v Value) (string, error) {
	switch v.k {
	case KindString:
		return v.s, nil
	case KindUndefined:
		return "", undefinedError(v)
	}
	return "", errorf("TypeError", "%s() argument must be str, not %s", fname, v.TypeName())
}

// ---- filter application ----

func (e *evaluator) applyFilter(f *filterExpr, v Value, s *scope) (Value, error) {
	if f.fn == nil {
		return Value{}, errorf("TemplateRuntimeError", "No filter named '%s' found.", f.name)
	}
	args, kw, err := e.evalArgs(&f.args, s)
	if err != nil {
		return Value{}, err
	}
	return f.fn(e, v, args, kw)
}

// applyFilterChain applies a filter chain whose innermost input is nil (block filters).
func (e *evaluator) applyFilterChain(x expr, v Value, s *scope) (Value, error) {
	f, ok := x.(*filterExpr)
	if !ok {
		return e.eval(x, s)
	}
	if f.e != nil {
		var err error
		if v, err = e.applyFilterChain(f.e, v, s); err != nil {
			return Value{}, err
		}
	}
	return e.applyFilter(f, v, s)
}

func (e *evaluator) callFilter(name string, v Value, args []Value, kw kwargs) (Value, error) {
	f := filters[name]
	if f == nil {
		return Value{}, errorf("TemplateRuntimeError", "No filter named '%s'.", name)
	}
	return f(e, v, args, kw)
}

func (e *evaluator) callTest(name string, v Value, args []Value, kw kwargs) (bool, error) {
	t := tests[name]
	if t == nil {
		return false, errorf("TemplateRuntimeError", "No test named '%s'.", name)
	}
	return t(e, v, args, kw)
}

// ---- attribute getters (make_attrgetter) ----

func attrParts(attr Value) []Value {
	if attr.k != KindString {
		return []Value{attr}
	}
	var parts []Value
	for _, p := range strings.Split(attr.s, ".") {
		if n, err := strconv.Atoi(p); err == nil && p != "" && (p[0] >= '0' && p[0] <= '9') {
			parts = append(parts, intValue(int64(n)))
		} else {
			parts = append(parts, StringValue(p))
		}
	}
	return parts
}

func (e *evaluator) attrGet(item Value, parts []Value, def Value) (Value, error) {
	for _, p := range parts {
		var err error
		if item, err = e.getitem(item, p); err != nil {
			return Value{}, err
		}
		if def.k != kindMissing && def.k != KindNone && item.k == KindUndefined {
			item = def
		}
	}
	return item, nil
}

func ignoreCase(v Value) Value {
	if v.k == KindString {
		return StringValue(pyLower(v.s))
	}
	return v
}
