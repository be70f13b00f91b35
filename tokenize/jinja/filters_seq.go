package jinja

// Filters of sequences and mappings: jinja2's filters.py for the filters that iterate,
// select, sort, group and aggregate.

import "strings"

func filterAttr(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("attr", []string{"name"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	name, err := wantStr("attr", a[0])
	if err != nil {
		return Value{}, err
	}
	if v.k == KindUndefined {
		return Value{}, undefinedError(v)
	}
	if r, ok := e.attribute(v, name); ok {
		return r, nil
	}
	return undefinedAttr(v, name), nil
}

func filterBatch(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("batch", []string{"linecount", "fill_with"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	n, err := wantInt("batch", a[0])
	if err != nil {
		return Value{}, err
	}
	if n <= 0 {
		return Value{}, errorf("ValueError", "batch size must be positive")
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	var out []Value
	for i := 0; i < len(items); i += n {
		end := i + n
		var row []Value
		if end > len(items) {
			row = append(row, items[i:]...)
			if a[1].k != kindMissing && a[1].k != KindNone {
				for len(row) < n {
					row = append(row, a[1])
				}
			}
		} else {
			row = append(row, items[i:end]...)
		}
		out = append(out, ListValue(row))
	}
	return generatorValue(out, "do_batch"), nil
}

func filterDictsort(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("dictsort", []string{"case_sensitive", "by", "reverse"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	if v.k != KindDict {
		if v.k == KindUndefined {
			return Value{}, undefinedError(v)
		}
		return Value{}, errorf("AttributeError", "'%s' object has no attribute 'items'", v.TypeName())
	}
	pos := 0
	switch by := orDefault(a[1], StringValue("key")); {
	case by.k == KindString && by.s == "key":
	case by.k == KindString && by.s == "value":
		pos = 1
	default:
		return Value{}, errorf("FilterArgumentError", "You can only sort by either \"key\" or \"value\"")
	}
	cs := orDefault(a[0], falseValue).Truth()
	d := v.dict()
	pairs := make([]Value, len(d.keys))
	for i := range d.keys {
		pairs[i] = tupleValue([]Value{d.keys[i], d.vals[i]})
	}
	key := func(p Value) Value {
		k := p.list().items[pos]
		if !cs {
			k = ignoreCase(k)
		}
		return k
	}
	out, err := sortValues(pairs, key, orDefault(a[2], falseValue).Truth())
	if err != nil {
		return Value{}, err
	}
	return ListValue(out), nil
}

// sortValues is Python's sorted(items, key=key, reverse=reverse) (stable).
func sortValues(items []Value, key func(Value) Value, reverse bool) ([]Value, error) {
	keys := make([]Value, len(items))
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
		c, err := compare("<", a, b)
		if err == errNaNCompare {
			return false
		}
		if err != nil {
			cmpErr = err
			return false
		}
		return c < 0
	}
	sortInts(idx, less)
	if cmpErr != nil {
		return nil, cmpErr
	}
	out := make([]Value, len(items))
	for i, j := range idx {
		out[i] = items[j]
	}
	return out, nil
}

func filterFirst(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	if v.k == kindGenerator {
		g := v.o.(*generator)
		if g.pos < len(g.items) {
			g.pos++
			return g.items[g.pos-1], nil
		}
		return undefinedHinted("No first item, sequence was empty.", false), nil
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	if len(items) == 0 {
		return undefinedHinted("No first item, sequence was empty.", false), nil
	}
	return items[0], nil
}

func filterLast(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	if v.k == kindGenerator {
		return Value{}, errorf("TypeError", "'%s' object is not reversible", v.TypeName())
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	if len(items) == 0 {
		return undefinedHinted("No last item, sequence was empty.", false), nil
	}
	return items[len(items)-1], nil
}

func filterGroupby(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("groupby", []string{"attribute", "default", "case_sensitive"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	if a[0].k == kindMissing {
		return Value{}, errorf("TypeError", "groupby() missing 1 required positional argument: 'attribute'")
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	parts := attrParts(a[0])
	cs := orDefault(a[2], falseValue).Truth()
	def := orDefault(a[1], noneValue)
	key := func(it Value) Value {
		k, err2 := e.attrGet(it, parts, def)
		if err2 != nil {
			err = err2
		}
		if !cs {
			k = ignoreCase(k)
		}
		return k
	}
	sorted, err2 := sortValues(items, key, false)
	if err != nil {
		return Value{}, err
	}
	if err2 != nil {
		return Value{}, err2
	}
	var out []Value
	for i := 0; i < len(sorted); {
		k := key(sorted[i])
		j := i + 1
		for j < len(sorted) && equal(key(sorted[j]), k) {
			j++
		}
		grouper := k
		if !cs {
			// the grouper is the value of the first item of the group
			g, err := e.attrGet(sorted[i], parts, def)
			if err != nil {
				return Value{}, err
			}
			grouper = g
		}
		out = append(out, tupleValue([]Value{grouper, ListValue(append([]Value(nil), sorted[i:j]...))}))
		i = j
	}
	return ListValue(out), nil
}

func filterItems(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	switch v.k {
	case KindUndefined:
		return generatorValue(nil, "do_items"), nil
	case KindDict:
		d := v.dict()
		out := make([]Value, len(d.keys))
		for i := range d.keys {
			out[i] = tupleValue([]Value{d.keys[i], d.vals[i]})
		}
		return generatorValue(out, "do_items"), nil
	}
	return Value{}, errorf("TypeError", "Can only get item pairs from a mapping.")
}

func filterJoin(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("join", []string{"d", "attribute"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	if a[1].k != kindMissing && a[1].k != KindNone {
		parts := attrParts(a[1])
		mapped := make([]Value, len(items))
		for i, it := range items {
			if mapped[i], err = e.attrGet(it, parts, Value{k: kindMissing}); err != nil {
				return Value{}, err
			}
		}
		items = mapped
	}
	sep := softStr(orDefault(a[0], emptyString))
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(sep)
		}
		writeStr(&b, it)
	}
	return StringValue(b.String()), nil
}

func filterLength(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	n, err := pyLen(v)
	if err != nil {
		return Value{}, err
	}
	return intValue(int64(n)), nil
}

func filterList(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	return ListValue(append([]Value(nil), items...)), nil
}

func filterMap(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	out := make([]Value, len(items))
	if len(args) == 0 {
		attr, ok := kw.get("attribute")
		if !ok {
			return Value{}, errorf("FilterArgumentError", "map requires a filter argument")
		}
		def := Value{k: kindMissing}
		for i, n := range kw.names {
			switch n {
			case "attribute":
			case "default":
				def = kw.vals[i]
			default:
				return Value{}, errorf("FilterArgumentError", "Unexpected keyword argument %s", pyQuote(n))
			}
		}
		parts := attrParts(attr)
		for i, it := range items {
			if out[i], err = e.attrGet(it, parts, def); err != nil {
				return Value{}, err
			}
		}
		return generatorValue(out, "do_map"), nil
	}
	name, err := wantStr("map", args[0])
	if err != nil {
		return Value{}, err
	}
	for i, it := range items {
		if out[i], err = e.callFilter(name, it, args[1:], kw); err != nil {
			return Value{}, err
		}
	}
	return generatorValue(out, "do_map"), nil
}

func minMax(e *evaluator, v Value, args []Value, kw kwargs, fname string, wantMax bool) (Value, error) {
	a, err := bind(fname, []string{"case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	if len(items) == 0 {
		return undefinedHinted("No aggregated item, sequence was empty.", false), nil
	}
	cs := orDefault(a[0], falseValue).Truth()
	var parts []Value
	if a[1].k != kindMissing && a[1].k != KindNone {
		parts = attrParts(a[1])
	}
	key := func(it Value) (Value, error) {
		k := it
		if parts != nil {
			var err error
			if k, err = e.attrGet(it, parts, Value{k: kindMissing}); err != nil {
				return Value{}, err
			}
		}
		if !cs {
			k = ignoreCase(k)
		}
		return k, nil
	}
	best := items[0]
	bestKey, err := key(best)
	if err != nil {
		return Value{}, err
	}
	for _, it := range items[1:] {
		k, err := key(it)
		if err != nil {
			return Value{}, err
		}
		var c int
		if wantMax {
			c, err = compare(">", k, bestKey)
		} else {
			c, err = compare("<", k, bestKey)
			c = -c
		}
		if err != nil && err != errNaNCompare {
			return Value{}, err
		}
		if err == nil && c > 0 {
			best, bestKey = it, k
		}
	}
	return best, nil
}

func filterMax(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	return minMax(e, v, args, kw, "max", true)
}
func filterMin(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	return minMax(e, v, args, kw, "min", false)
}

func (e *evaluator) selectOrReject(v Value, args []Value, kw kwargs, attr, keep bool) (Value, error) {
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	off := 0
	var parts []Value
	if attr {
		if len(args) == 0 {
			return Value{}, errorf("FilterArgumentError", "Missing parameter for attribute name")
		}
		parts = attrParts(args[0])
		off = 1
	}
	testName := ""
	var testArgs []Value
	if len(args) > off {
		if testName, err = wantStr("select", args[off]); err != nil {
			return Value{}, err
		}
		testArgs = args[off+1:]
	}
	var out []Value
	for _, it := range items {
		x := it
		if attr {
			if x, err = e.attrGet(it, parts, Value{k: kindMissing}); err != nil {
				return Value{}, err
			}
		}
		var ok bool
		if testName == "" {
			ok = x.Truth()
		} else if ok, err = e.callTest(testName, x, testArgs, kw); err != nil {
			return Value{}, err
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return generatorValue(out, "select_or_reject"), nil
}

func filterSelect(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	return e.selectOrReject(v, args, kw, false, true)
}
func filterReject(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	return e.selectOrReject(v, args, kw, false, false)
}
func filterSelectattr(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	return e.selectOrReject(v, args, kw, true, true)
}
func filterRejectattr(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	return e.selectOrReject(v, args, kw, true, false)
}

func filterReverse(_ *evaluator, v Value, _ []Value, _ kwargs) (Value, error) {
	if v.k == KindString {
		r := []rune(v.s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return StringValue(string(r)), nil
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, errorf("FilterArgumentError", "argument must be iterable")
	}
	out := make([]Value, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	switch v.k {
	case kindGenerator:
		return ListValue(out), nil // reversed() fails on iterators; jinja2 falls back to a list
	case KindList:
		return Value{k: kindGenerator, o: &generator{items: out, name: "list_reverseiterator"}}, nil
	case KindDict, kindView:
		return Value{k: kindGenerator, o: &generator{items: out, name: "dict_reversekeyiterator"}}, nil
	}
	return Value{k: kindGenerator, o: &generator{items: out, name: "reversed"}}, nil
}

func filterSlice(_ *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("slice", []string{"slices", "fill_with"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	n, err := wantInt("slice", a[0])
	if err != nil {
		return Value{}, err
	}
	if n <= 0 {
		return Value{}, errorf("ZeroDivisionError", "integer division or modulo by zero")
	}
	seq, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	length := len(seq)
	per := length / n
	extra := length % n
	offset := 0
	var out []Value
	for i := 0; i < n; i++ {
		start := offset + i*per
		if i < extra {
			offset++
		}
		end := offset + (i+1)*per
		tmp := append([]Value(nil), seq[start:end]...)
		if a[1].k != kindMissing && a[1].k != KindNone && i >= extra {
			tmp = append(tmp, a[1])
		}
		out = append(out, ListValue(tmp))
	}
	return generatorValue(out, "sync_do_slice"), nil
}

func filterSort(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("sort", []string{"reverse", "case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	cs := orDefault(a[1], falseValue).Truth()
	var attrs [][]Value
	if a[2].k != kindMissing && a[2].k != KindNone {
		if a[2].k == KindString {
			for _, part := range strings.Split(a[2].s, ",") {
				attrs = append(attrs, attrParts(StringValue(part)))
			}
		} else {
			attrs = [][]Value{{a[2]}}
		}
	}
	var kerr error
	key := func(it Value) Value {
		if attrs == nil {
			if !cs {
				return ignoreCase(it)
			}
			return it
		}
		ks := make([]Value, len(attrs))
		for i, p := range attrs {
			k, err := e.attrGet(it, p, Value{k: kindMissing})
			if err != nil {
				kerr = err
			}
			if !cs {
				k = ignoreCase(k)
			}
			ks[i] = k
		}
		if len(ks) == 1 {
			return ks[0]
		}
		return ListValue(ks)
	}
	out, err := sortValues(items, key, orDefault(a[0], falseValue).Truth())
	if kerr != nil {
		return Value{}, kerr
	}
	if err != nil {
		return Value{}, err
	}
	return ListValue(out), nil
}

func filterSum(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("sum", []string{"attribute", "start"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	acc := orDefault(a[1], intValue(0))
	var parts []Value
	if a[0].k != kindMissing && a[0].k != KindNone {
		parts = attrParts(a[0])
	}
	for _, it := range items {
		if parts != nil {
			if it, err = e.attrGet(it, parts, Value{k: kindMissing}); err != nil {
				return Value{}, err
			}
		}
		if acc.k == KindString {
			return Value{}, errorf("TypeError", "sum() can't sum strings [use ''.join(seq) instead]")
		}
		if acc, err = add(acc, it); err != nil {
			return Value{}, err
		}
	}
	return acc, nil
}

func filterUnique(e *evaluator, v Value, args []Value, kw kwargs) (Value, error) {
	a, err := bind("unique", []string{"case_sensitive", "attribute"}, args, kw)
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(v)
	if err != nil {
		return Value{}, err
	}
	cs := orDefault(a[0], falseValue).Truth()
	var parts []Value
	if a[1].k != kindMissing && a[1].k != KindNone {
		parts = attrParts(a[1])
	}
	var seen []Value
	var out []Value
outer:
	for _, it := range items {
		k := it
		if parts != nil {
			if k, err = e.attrGet(it, parts, Value{k: kindMissing}); err != nil {
				return Value{}, err
			}
		}
		if !cs {
			k = ignoreCase(k)
		}
		if !hashable(k) {
			return Value{}, errorf("TypeError", "unhashable type: '%s'", k.TypeName())
		}
		for _, s := range seen {
			if equal(s, k) {
				continue outer
			}
		}
		seen = append(seen, k)
		out = append(out, it)
	}
	return generatorValue(out, "do_unique"), nil
}
